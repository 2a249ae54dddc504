#!/usr/bin/env python3
"""What encryption at rest costs: the same workload on a plain data dir and
on one mounted with `[encryption]`, in one run, alternating (plain then
sealed, sealed then plain, ...) so that drift of the machine hits both alike.

Per round and mode, on a fresh data dir (one account, one writer, 4 users):
  commit  N four-step node writes (Python, as docs/AGENTS.md shows), the
          latency of each whole write; p50 and mean
  search  Q queries through `.search/` files after the index caught up; p50
  read    after a remount (no page cache, index loaded again): `cat` of
          every node's content.md and .abstract.md, the latency of each
          node's two reads; p50 and mean
  mount   time from `ctxfs mount` to the first search answer after the
          remount (the index documents are decrypted at load)

The figure is the ratio sealed / plain of each (1.00: no cost). The
embedder is the hashing one unless --model-dir is given: a cheaper query
makes the search's own cost a larger share, so the ratio is the harsher.

    python3 scripts/bench_atrest.py --bin target/release/ctxfs [--nodes 2000] [--rounds 4]
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import query_name, wait_sync  # noqa: E402

WORDS = ("garden river coffee piano mountain ticket doctor invoice meeting birthday "
         "recipe bicycle passport laptop holiday museum football library concert "
         "flight hotel salary dentist rental camera market lesson project deadline "
         "budget kitchen window winter summer autumn spring weekend morning evening").split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".\n"


def write_node(d, rng):
    os.makedirs(d, exist_ok=True)
    for name, data in (("content.md", text(rng, 120)), (".relations.json", "[]\n"),
                       (".abstract.md", text(rng, 12)), (".overview.md", "# overview\n" + text(rng, 40)),
                       (".meta.json", '{"status": "ACTIVE"}\n')):
        with open(os.path.join(d, name), "w") as f:
            f.write(data)


def mount(args, mnt, data, cfg):
    cmd = [args.bin, "mount", mnt, "--data", data, "--config", cfg]
    if args.model_dir:
        cmd += ["--model-dir", args.model_dir]
    else:
        cmd += ["--embedder", "hash"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def umount(args, mnt):
    subprocess.run([args.bin, "umount", mnt], check=True, stdout=subprocess.DEVNULL)


def one(args, sealed, seed):
    tmp = tempfile.mkdtemp(prefix="ctxfs-atrest-", dir="/var/tmp")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cfg = os.path.join(tmp, "config.toml")
    with open(cfg, "w") as f:
        f.write('[[account]]\nid = "bench"\nwriters = [0]\n')
        if sealed:
            key = os.path.join(tmp, "master.key")
            fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, os.urandom(32).hex().encode())
            os.close(fd)
            f.write(f'[encryption]\nkey_file = "{key}"\n')
    rng = random.Random(seed)
    out = {}
    try:
        mount(args, mnt, data, cfg)
        base = os.path.join(mnt, "accounts/bench/users")
        nodes = []
        lat = []
        for i in range(args.nodes):
            d = os.path.join(base, f"u{i % 4}", "memories", f"c{i % 20}", f"n{i}")
            t = time.perf_counter()
            write_node(d, rng)
            lat.append(time.perf_counter() - t)
            nodes.append(d[len(mnt) + 1:])
        out["commit_p50"] = statistics.median(lat) * 1e3
        out["commit_mean"] = statistics.mean(lat) * 1e3
        wait_sync(mnt)
        qs = [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(args.queries)]
        lat = []
        for q in qs:
            t = time.perf_counter()
            with open(os.path.join(mnt, "accounts/bench/.search", query_name(q, "k=10"))) as f:
                f.read()
            lat.append(time.perf_counter() - t)
        out["search_p50"] = statistics.median(lat) * 1e3
        umount(args, mnt)
        t = time.perf_counter()
        mount(args, mnt, data, cfg)
        with open(os.path.join(mnt, "accounts/bench/.search", query_name("garden river", "k=10"))) as f:
            f.read()
        out["mount_s"] = time.perf_counter() - t
        # The graph's phase two finishes in the background: let it.
        wait_sync(mnt)
        time.sleep(1)
        lat = []
        for n in nodes:
            t = time.perf_counter()
            for name in ("content.md", ".abstract.md"):
                with open(os.path.join(mnt, n, name), "rb") as f:
                    f.read()
            lat.append(time.perf_counter() - t)
        out["read_p50"] = statistics.median(lat) * 1e3
        out["read_mean"] = statistics.mean(lat) * 1e3
        umount(args, mnt)
        out["store_mb"] = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)
                              if os.path.isfile(os.path.join(data, f))) / 2**20
    finally:
        subprocess.run([args.bin, "umount", mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model-dir")
    args = ap.parse_args()
    runs = {False: [], True: []}
    for r in range(args.rounds):
        # ABBA: each mode goes first in half the rounds (this disk's fsync
        # latency drifts, and the second of two runs is often the slower).
        for sealed in ((False, True) if r % 2 == 0 else (True, False)):
            o = one(args, sealed, seed=r)
            runs[sealed].append(o)
            print(f"round {r + 1} {'sealed' if sealed else 'plain '}: "
                  + "  ".join(f"{k} {v:.3f}" for k, v in o.items()), file=sys.stderr)
    keys = ["commit_p50", "commit_mean", "search_p50", "read_p50", "read_mean", "mount_s", "store_mb"]
    print(f"{args.nodes} nodes, {args.queries} queries, {args.rounds} rounds, embedder "
          f"{'MiniLM' if args.model_dir else 'hash'}; median of the rounds")
    print(f"{'figure':<12} {'plain':>9} {'sealed':>9} {'ratio':>7}")
    for k in keys:
        p = statistics.median(o[k] for o in runs[False])
        s = statistics.median(o[k] for o in runs[True])
        unit = "MiB" if k == "store_mb" else ("s" if k == "mount_s" else "ms")
        print(f"{k:<12} {p:>8.3f}{unit[0]} {s:>8.3f}{unit[0]} {s / p:>6.2f}x")


if __name__ == "__main__":
    main()
