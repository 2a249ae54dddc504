#!/usr/bin/env python3
"""A follower under a steady stream of remote commits (two daemons, one
PostgreSQL; scripts/pg-setup.sh runs PostgreSQL 18 + pgvector).

For each account size N (default 10,000 and 100,000 nodes, hashing
embedder):
  load      N nodes through `.ctxfs/batch` on daemon A (PostgreSQL), and the
            same N on a daemon on redb in the same run: nodes/s, and the
            ratio PostgreSQL / redb
  cost      B (the follower) has the account loaded and does nothing else;
            A commits R nodes/s for S seconds (four-step writes, paced):
            B's CPU time (utime + stime) per remote commit, and whether B
            loaded the account again (`index_loads`)
  serve     the same stream again while B answers searches back to back:
            B's search p50/p99, and for every 10th commit the time from A's
            commit to B's first search that finds its unique word

The follower's CPU per remote commit should not grow with N: the ratio to
the smallest size is printed.

    python3 scripts/bench_follow.py --bin target/release/ctxfs [--sizes 10000,100000] [--rate 50] [--seconds 20]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import query_name, wait_sync  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = os.path.join(ROOT, "scripts", "pg-setup.sh")
WORDS = ("garden river coffee piano mountain ticket doctor invoice meeting birthday "
         "recipe bicycle passport laptop holiday museum football library concert "
         "flight hotel salary dentist rental camera market lesson project deadline").split()


def pg(*args):
    return subprocess.run([PG, *args], check=True, capture_output=True, text=True).stdout.strip()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)) + ".\n"


class Daemon:
    def __init__(self, args, tmp, name, store=None):
        self.args = args
        self.mnt = os.path.join(tmp, name, "mnt")
        self.data = os.path.join(tmp, name, "data")
        os.makedirs(self.mnt)
        self.cfg = os.path.join(tmp, "config.toml")
        cmd = [args.bin, "mount", self.mnt, "--data", self.data, "--config", self.cfg,
               "--embedder", "hash"]
        if store:
            cmd += ["--store", store]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.mnt, ".ctxfs/pid")) as f:
            self.pid = int(f.read())

    def status(self):
        with open(os.path.join(self.mnt, ".ctxfs/status")) as f:
            return json.load(f)

    def cpu_s(self):
        with open(f"/proc/{self.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

    def search(self, q, k=10):
        with open(os.path.join(self.mnt, "accounts/acme/.search", query_name(q, f"k={k}"))) as f:
            return f.read()

    def umount(self):
        subprocess.run([self.args.bin, "umount", self.mnt], stdout=subprocess.DEVNULL)


def load(d, n, rng):
    t = time.time()
    for start in range(0, n, 5000):
        lines = [json.dumps({"node": f"users/u/memories/c{i % 100:02d}/n{i}",
                             "content": text(rng, 40), "meta": {"status": "ACTIVE"}})
                 for i in range(start, min(n, start + 5000))]
        with open(os.path.join(d.mnt, "accounts/acme/.ctxfs/batch"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return n / (time.time() - t)


def stream(d, tag, rate, seconds, done=None):
    """Four-step commits on `d`, paced at `rate`/s; `done(i, t)` after each."""
    n = int(rate * seconds)
    t0 = time.time()
    for i in range(n):
        wait = t0 + i / rate - time.time()
        if wait > 0:
            time.sleep(wait)
        node = os.path.join(d.mnt, f"accounts/acme/users/u/memories/live/{tag}{i}")
        os.makedirs(node, exist_ok=True)
        for name, data in (("content.md", f"remote commit zq{tag}x{i} about a garden\n"),
                           (".relations.json", "[]\n"), (".meta.json", '{"status": "ACTIVE"}\n')):
            with open(os.path.join(node, name), "w") as f:
                f.write(data)
        if done:
            done(i, time.time())
    return n


def one_size(args, n, rng):
    tmp = tempfile.mkdtemp(prefix="ctxfs-follow-", dir="/var/tmp")
    with open(os.path.join(tmp, "config.toml"), "w") as f:
        f.write('[[account]]\nid = "acme"\nwriters = [0]\n')
    db = f"ctxfs_follow_{os.getpid()}_{n}"
    url = pg("createdb", db)
    out = {"nodes": n}
    try:
        r = Daemon(args, tmp, "redb")
        out["redb_load"] = load(r, n, random.Random(1))
        r.umount()
        a = Daemon(args, tmp, "a", url)
        out["pg_load"] = load(a, n, random.Random(1))
        wait_sync(a.mnt)
        b = Daemon(args, tmp, "b", url)
        b.search("garden river")
        while b.status()["indexer"].get("accounts_loading_vectors", 0):
            time.sleep(0.2)
        loads0 = b.status()["indexer"]["index_loads"]
        # cost: B idle.
        c0 = b.cpu_s()
        k = stream(a, "c", args.rate, args.seconds)
        wait_sync(b.mnt)
        out["cpu_ms_per_commit"] = (b.cpu_s() - c0) * 1e3 / k
        # serve: B searches while A commits; every 10th commit is looked for.
        lat, vis = [], []
        stop = threading.Event()
        probes = []

        def note(i, t):
            if i % 10 == 0:
                probes.append((f"zqsx{i}", t))

        def writer():
            stream(a, "s", args.rate, args.seconds, note)
            stop.set()

        w = threading.Thread(target=writer)
        w.start()
        pending = []
        while not stop.is_set() or pending or probes:
            while probes:
                pending.append(probes.pop(0))
            q = " ".join(random.choice(WORDS) for _ in range(3))
            t = time.perf_counter()
            b.search(q)
            lat.append(time.perf_counter() - t)
            still = []
            for word, t_commit in pending:
                if word in b.search(word, 3):
                    vis.append(time.time() - t_commit)
                elif time.time() - t_commit > 10:
                    vis.append(float("inf"))
                else:
                    still.append((word, t_commit))
            pending = still
        w.join()
        lat.sort()
        vis.sort()
        out["search_p50_ms"] = lat[len(lat) // 2] * 1e3
        out["search_p99_ms"] = lat[int(len(lat) * 0.99)] * 1e3
        out["visible_p50_ms"] = vis[len(vis) // 2] * 1e3
        out["visible_max_ms"] = vis[-1] * 1e3
        out["reloads"] = b.status()["indexer"]["index_loads"] - loads0
        out["applied"] = b.status()["indexer"]["remote_docs_applied"]
        b.umount()
        a.umount()
    finally:
        for name in ("redb", "a", "b"):
            subprocess.run([args.bin, "umount", os.path.join(tmp, name, "mnt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pg("dropdb", db)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    pg("start")
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        o = one_size(args, n, random.Random(n))
        print(json.dumps(o), file=sys.stderr)
        rows.append(o)
    base = rows[0]
    print(f"follower under {args.rate:g} remote commits/s for {args.seconds:g} s (hashing embedder)")
    print(f"{'nodes':>8} {'batch pg/s':>11} {'redb/s':>8} {'pg/redb':>8} {'cpu ms/commit':>14} {'ratio':>6} "
          f"{'search p50':>11} {'p99':>8} {'visible p50':>12} {'max':>8} {'reloads':>8}")
    for o in rows:
        print(f"{o['nodes']:>8} {o['pg_load']:>11.0f} {o['redb_load']:>8.0f} {o['pg_load'] / o['redb_load']:>7.2f}x "
              f"{o['cpu_ms_per_commit']:>14.3f} {o['cpu_ms_per_commit'] / base['cpu_ms_per_commit']:>5.2f}x "
              f"{o['search_p50_ms']:>9.2f}ms {o['search_p99_ms']:>6.2f}ms {o['visible_p50_ms']:>10.1f}ms "
              f"{o['visible_max_ms']:>6.0f}ms {o['reloads']:>8}")


if __name__ == "__main__":
    main()
