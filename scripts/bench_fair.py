#!/usr/bin/env python3
"""Fairness between tenants: one tenant's four-step commits while another
tenant writes 10,000-node batches through `.ctxfs/batch`, against the same
commits alone, in one run on one mount (release binary, hashing embedder).

    python3 scripts/bench_fair.py [--bin target/release/ctxfs] [--commits 300]

Prints the commit latency p50/p99 alone and beside the batches, and their
ratio; the figures go to docs/BENCHMARKS.md with this command.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time

CONFIG = """
[[account]]
id = "quiet"
writers = [0]

[[account]]
id = "bulk"
writers = [0]
"""


def four_steps(d, i):
    os.makedirs(d, exist_ok=True)
    for name, body in (("content.md", f"note {i} of the quiet tenant"),
                       (".abstract.md", f"note {i}"),
                       (".overview.md", "overview"),
                       (".meta.json", '{"status":"ACTIVE"}')):
        with open(os.path.join(d, name), "w") as f:
            f.write(body)


def commits(mnt, n, tag):
    lat = []
    base = os.path.join(mnt, "accounts/quiet/users/q/memories", tag)
    for i in range(n):
        t = time.perf_counter()
        four_steps(os.path.join(base, f"n{i}"), i)
        lat.append((time.perf_counter() - t) * 1000)
    return lat


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--batch-nodes", type=int, default=10000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ctxfs-fair-")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cfg = os.path.join(tmp, "config.toml")
    open(cfg, "w").write(CONFIG)
    subprocess.run([a.bin, "mount", mnt, "--data", data, "--config", cfg,
                    "--embedder", "hash", "--no-index"], check=True, capture_output=True)
    try:
        alone = commits(mnt, a.commits, "alone")
        stop = threading.Event()
        batches = [0]
        closes = []

        def bulk():
            k = 0
            while not stop.is_set():
                lines = "".join(json.dumps({
                    "node": f"users/b/memories/c{k}/n{i}",
                    "content": f"bulk node {i} of batch {k}",
                    "meta": {"status": "ACTIVE"}}) + "\n" for i in range(a.batch_nodes))
                f = open(os.path.join(mnt, "accounts/bulk/.ctxfs/batch"), "w")
                f.write(lines)
                t0 = time.perf_counter()
                f.close()
                closes.append(time.perf_counter() - t0)
                batches[0] += 1
                k += 1

        t = threading.Thread(target=bulk)
        t.start()
        time.sleep(1.0)
        beside = commits(mnt, a.commits, "beside")
        stop.set()
        t.join()
        for name, v in (("alone", alone), ("beside 10k-node batches", beside)):
            print(f"{name:26s} commit p50 {pct(v, 50):7.1f} ms  p99 {pct(v, 99):7.1f} ms  max {max(v):7.1f} ms")
        print(f"ratio beside/alone: p50 {pct(beside, 50) / pct(alone, 50):.1f}x  "
              f"p99 {pct(beside, 99) / pct(alone, 99):.1f}x  ({batches[0]} batches of {a.batch_nodes} nodes)")
        print(f"the bulk tenant's batches: {a.batch_nodes / statistics.median(closes):.0f} nodes/s "
              f"(median close of a {a.batch_nodes}-node batch {statistics.median(closes) * 1000:.0f} ms)")
    finally:
        subprocess.run([a.bin, "umount", mnt], capture_output=True)


if __name__ == "__main__":
    main()
