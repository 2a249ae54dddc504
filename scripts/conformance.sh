#!/bin/sh
# POSIX conformance: pjdfstest (the groups that apply) in a project
# scratchpad, and fsx over a node's content.md. Installs both with cargo
# when missing. Exit status 0 only when nothing unexpected failed.
set -eu
BIN=${BIN:-target/release/ctxfs}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v pjdfstest >/dev/null || cargo install --locked pjdfstest
command -v fsx >/dev/null || cargo install --locked fsx
id tests >/dev/null 2>&1 || useradd -M tests
T=$(mktemp -d /tmp/ctxfs-conformance-XXXXXX)
chmod 755 "$T"
M=$T/mnt
mkdir -p "$M"
"$BIN" mount "$M" --data "$T/data" --no-index
trap '"$BIN" umount "$M" >/dev/null 2>&1 || umount -l "$M"; rm -rf "$T"' EXIT
mkdir -p "$M/accounts/conf/projects/p" "$M/accounts/conf/users/u/memories/c/fsx"
S=$M/accounts/conf/projects/p/scratchpad
echo "== pjdfstest in $S"
(cd "$S" && pjdfstest -c "$HERE/pjdfstest.toml" -p "$S" \
  open mkdir rmdir rename unlink truncate ftruncate chmod utimensat) > "$T/pjdfstest.log" 2>&1 || {
  grep -E "FAILED$|Summary" "$T/pjdfstest.log"; echo "pjdfstest: unexpected failures" >&2; exit 1; }
grep Summary "$T/pjdfstest.log"
grep -q "Summary: 0 failed" "$T/pjdfstest.log" || { echo "pjdfstest: unexpected failures" >&2; exit 1; }
echo "== fsx over a node's content.md"
(cd "$T" && fsx -f "$HERE/fsx.toml" -N "${FSX_OPS:-100000}" -S "${FSX_SEED:-1}" \
  "$M/accounts/conf/users/u/memories/c/fsx/content.md" | tail -1)
echo "conformance: ok"
