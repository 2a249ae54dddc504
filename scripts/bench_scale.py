#!/usr/bin/env python3
"""How cost grows with nodes and accounts, on the embedded store.

For each shape (one account of N nodes, or A accounts of M nodes), on a
fresh data dir with the hashing embedder (`--model-dir DIR`: MiniLM), or a
fresh PostgreSQL database (`--postgres`; "on disk" is then the database's
size):
  - load: the nodes written through `.ctxfs/batch` (batches of 5,000),
    then `.ctxfs/sync` (on PostgreSQL, then `VACUUM ANALYZE` untimed, so
    the server's autovacuum of the fresh tables does not run meanwhile);
  - mount-ready time (a remount: `ctxfs mount` returns when the mount
    answers) and time to the first search answer after it;
  - the daemon's RSS after that first answer, and after the timed rows;
  - commit latency p50/p99: one writer, 200 four-step commits of new nodes
    in existing categories, spread over the accounts (Python);
  - search p50/p99: 200 distinct queries in the account (or spread over the
    accounts), `k=10`;
  - `ctxfs fsck` time (unmounted) and the data dir's size on disk.
Every figure is printed beside its ratio to the smallest shape of the run,
so the growth shows (linear in the nodes, sub-linear, worse).

    python3 scripts/bench_scale.py --bin target/release/ctxfs \
        [--shapes 1x10000,1x100000,1000x20] [--model-dir models/all-MiniLM-L6-v2] [--postgres] [--keep]
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import query_name, wait_sync  # noqa: E402

WORDS = ("river mountain coffee keyboard garden violin harbor winter lantern pepper "
         "rocket meadow signal copper velvet canyon orbit ember glacier tulip "
         "compass falcon marble saddle thunder willow cobalt prairie quartz raven").split()


def text(rng, i):
    return " ".join(rng.choice(WORDS) for _ in range(12)) + f" memo {i}."


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * q)))]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return int(m.group(1)) / 1024


MODEL_DIR = None  # --model-dir: MiniLM instead of the hashing embedder
PG_SETUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pg-setup.sh")
STORES = {}  # --postgres: the database URL of each data dir
POSTGRES = False
KEEP = False  # --keep: leave the data dirs (and databases) for a look


def pg(*args):
    return subprocess.run([PG_SETUP, *args], check=True, capture_output=True, text=True).stdout.strip()


def mount(bin_path, mnt, data, cfg):
    emb = ["--embedder", "minilm", "--model-dir", MODEL_DIR] if MODEL_DIR else ["--embedder", "hash"]
    store = ["--store", STORES[data]] if data in STORES else []
    out = subprocess.run([bin_path, "mount", mnt, "--data", data, "--config", cfg] + emb + store,
                         check=True, capture_output=True, text=True).stdout
    return int(re.search(r"pid (\d+)", out).group(1))


def batch(mnt, account, lines):
    with open(os.path.join(mnt, "accounts", account, ".ctxfs", "batch"), "w") as f:
        f.write("\n".join(lines) + "\n")


def four_step(node, body):
    os.makedirs(node, exist_ok=True)
    for name, data in (("content.md", body), (".relations.json", "[]"),
                       (".meta.json", '{"status": "ACTIVE"}')):
        with open(os.path.join(node, name), "w") as f:
            f.write(data)


def run_shape(bin_path, base, accounts, per, rng):
    tmp = os.path.join(base, f"{accounts}x{per}")
    mnt, data, cfg = os.path.join(tmp, "mnt"), os.path.join(tmp, "data"), os.path.join(tmp, "config.toml")
    os.makedirs(mnt)
    names = [f"a{i:05d}" for i in range(accounts)]
    with open(cfg, "w") as f:
        for a in names:
            f.write(f'[[account]]\nid = "{a}"\nwriters = [0]\n')
    r = {"shape": f"{accounts} × {per:,}", "nodes": accounts * per}
    if POSTGRES:
        db = f"ctxfs_scale_{os.getpid()}_{accounts}x{per}"
        STORES[data] = pg("createdb", db)
    pid = mount(bin_path, mnt, data, cfg)
    t = time.time()
    n = 0
    for a in names:
        for start in range(0, per, 5000):
            lines = [json.dumps({"node": f"users/u/memories/c{i % 100:02d}/n{i}",
                                 "content": text(rng, i), "meta": {"status": "ACTIVE"}})
                     for i in range(start, min(per, start + 5000))]
            batch(mnt, a, lines)
            n += len(lines)
        if accounts > 1 and names.index(a) % 1000 == 999:
            print(f"    {names.index(a) + 1} accounts loaded", file=sys.stderr)
    wait_sync(mnt)
    r["load_s"] = time.time() - t
    subprocess.run([bin_path, "umount", mnt], check=True)
    if data in STORES:
        # The server's autovacuum would work through the freshly loaded
        # tables during the timed rows below: settle them first, as a
        # database is when a daemon restarts on it.
        pg("sql", db, "VACUUM ANALYZE")
    # Remount: ready, then the first answer.
    t = time.time()
    pid = mount(bin_path, mnt, data, cfg)
    r["mount_s"] = time.time() - t
    with open(os.path.join(mnt, "accounts", names[0], ".search", query_name("river coffee", "k=10"))) as f:
        f.read()
    r["first_answer_s"] = time.time() - t
    r["rss_first_mib"] = rss_mib(pid)
    # Commits: one writer, new nodes spread over the accounts, each in a
    # category that exists (a new category would add its directories' own
    # creation to the figure).
    lat = []
    for i in range(200):
        a = names[i % accounts]
        node = os.path.join(mnt, "accounts", a, f"users/u/memories/c{i % min(per, 100):02d}/w{i}")
        s = time.perf_counter()
        four_step(node, text(rng, i))
        lat.append((time.perf_counter() - s) * 1000)
    r["commit_p50_ms"], r["commit_p99_ms"] = pct(lat, .5), pct(lat, .99)
    wait_sync(mnt)
    # Searches: distinct queries, over as many accounts as there are (up to 200).
    lat = []
    for i in range(200):
        a = names[(i * 7919) % accounts]
        q = f"{rng.choice(WORDS)} {rng.choice(WORDS)} {i}"
        s = time.perf_counter()
        with open(os.path.join(mnt, "accounts", a, ".search", query_name(q, "k=10"))) as f:
            f.read()
        lat.append((time.perf_counter() - s) * 1000)
    r["search_p50_ms"], r["search_p99_ms"] = pct(lat, .5), pct(lat, .99)
    r["rss_end_mib"] = rss_mib(pid)
    subprocess.run([bin_path, "umount", mnt], check=True)
    t = time.time()
    where = ["--store", STORES[data]] if data in STORES else ["--data", data]
    fsck = subprocess.run([bin_path, "fsck"] + where, capture_output=True, text=True)
    r["fsck_s"] = time.time() - t
    r["fsck_ok"] = fsck.returncode == 0
    if data in STORES:
        # The database's size (its tables and indexes, not the server's WAL).
        r["disk_mb"] = int(pg("sql", db, "SELECT pg_database_size(current_database())")) / 1e6
        if not KEEP:
            pg("dropdb", db)
    else:
        r["disk_mb"] = int(subprocess.run(["du", "-sk", data], capture_output=True, text=True)
                           .stdout.split()[0]) / 1024
    print(f"  {json.dumps(r)}", file=sys.stderr)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--shapes", default="1x10000,1x100000,1000x20")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--model-dir", help="MiniLM's files: embed with it instead of the hashing embedder")
    ap.add_argument("--postgres", action="store_true",
                    help="each shape in a fresh database on scripts/pg-setup.sh's PostgreSQL")
    args = ap.parse_args()
    global MODEL_DIR, POSTGRES, KEEP
    KEEP = args.keep
    MODEL_DIR = os.path.abspath(args.model_dir) if args.model_dir else None
    POSTGRES = args.postgres
    if POSTGRES:
        pg("start")
    bin_path = os.path.abspath(args.bin)
    rng = random.Random(5)
    base = tempfile.mkdtemp(prefix="ctxfs-bench-scale-", dir="/var/tmp")
    rows = []
    try:
        for shape in args.shapes.split(","):
            a, per = (int(x) for x in shape.split("x"))
            print(f"shape {a} account(s) × {per} nodes", file=sys.stderr)
            rows.append(run_shape(bin_path, base, a, per, rng))
    finally:
        for d in os.listdir(base):
            subprocess.run([bin_path, "umount", os.path.join(base, d, "mnt")], capture_output=True)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    first = rows[0]
    cols = [("nodes", "nodes", "{:,.0f}"), ("load, s", "load_s", "{:.1f}"),
            ("mount ready, s", "mount_s", "{:.2f}"), ("first answer, s", "first_answer_s", "{:.2f}"),
            ("RSS after it, MiB", "rss_first_mib", "{:.0f}"), ("RSS at the end, MiB", "rss_end_mib", "{:.0f}"),
            ("commit p50 / p99, ms", ("commit_p50_ms", "commit_p99_ms"), "{:.1f}"),
            ("search p50 / p99, ms", ("search_p50_ms", "search_p99_ms"), "{:.1f}"),
            ("fsck, s", "fsck_s", "{:.2f}"), ("on disk, MB", "disk_mb", "{:.0f}")]
    print("\n| shape | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for _, k, fmt in cols:
            if isinstance(k, tuple):
                v = " / ".join(fmt.format(r[x]) for x in k)
                ratio = r[k[0]] / first[k[0]] if first[k[0]] else 0
            else:
                v = fmt.format(r[k])
                ratio = r[k] / first[k] if first[k] else 0
            cells.append(v if r is first else f"{v} ({ratio:.1f}×)")
        print(f"| {r['shape']} | " + " | ".join(cells) + " |")
    print(f"\nfsck clean in every shape: {all(r['fsck_ok'] for r in rows)}")


if __name__ == "__main__":
    main()
