#!/usr/bin/env python3
"""Recall to a budget: does `?budget=N` cost search time?

  python3 scripts/bench_budget.py [--nodes 10000] [--budget 500] [--queries 200]

Commits N nodes (~1 KB of text each, an abstract and an overview) through
`.ctxfs/batch` on a fresh mount (hashing embedder, or MiniLM with
--model-dir), waits for `.ctxfs/sync`, then reads `DIR/.search/QUERY` and
`DIR/.search/QUERY?budget=N` for the same distinct queries, alternating,
and prints p50/p99 of each and their ratio (the baseline is the unbudgeted
search of the same run). Figures go to docs/BENCHMARKS.md.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import query_name, wait_sync  # noqa: E402
from token_estimate import estimate  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("CTXFS_BIN", os.path.join(HERE, "../target/release/ctxfs"))
WORDS = ("kettle tea water boil morning garden rain bicycle train ticket station coffee "
         "market bread cheese river bridge window lamp desk paper letter stamp garden "
         "mountain snow boots jacket scarf piano song choir evening candle dinner").split()


def node(i):
    rnd = random.Random(i)
    lines = [" ".join(rnd.choice(WORDS) for _ in range(14)) + "." for _ in range(12)]
    return {"node": f"users/u{i % 20}/memories/c{(i // 20) % 50}/n{i}",
            "content": "\n".join(lines) + "\n",
            "abstract": " ".join(lines[0].split()[:10]),
            "overview": f"# note {i}\n{lines[1]}",
            "meta": {"status": "ACTIVE"}}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--budget", type=int, default=500)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--model-dir")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctxfs-bench-budget-", dir="/var/tmp")
    mnt, data = os.path.join(work, "mnt"), os.path.join(work, "data")
    os.makedirs(mnt)
    args = [BIN, "mount", mnt, "--data", data]
    args += ["--model-dir", a.model_dir, "--embedder", "minilm"] if a.model_dir else ["--embedder", "hash"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    try:
        os.makedirs(os.path.join(mnt, "accounts/acme"), exist_ok=True)
        t = time.time()
        for start in range(0, a.nodes, 2000):
            lines = "".join(json.dumps(node(i)) + "\n" for i in range(start, min(a.nodes, start + 2000)))
            with open(os.path.join(mnt, "accounts/acme/.ctxfs/batch"), "w") as f:
                f.write(lines)
        wait_sync(mnt)
        print(f"{a.nodes} nodes committed and indexed in {time.time() - t:.1f} s", file=sys.stderr)
        rnd = random.Random(7)
        queries = [" ".join(rnd.sample(WORDS, 3)) + f" {i}" for i in range(a.queries)]
        d = os.path.join(mnt, "accounts/acme")
        plain, packed, sizes = [], [], []
        for n, q in enumerate(queries):
            pair = [(plain, ""), (packed, f"budget={a.budget}")]
            # Which goes first alternates, so neither gains from the other's warm-up.
            for out, opts in (pair if n % 2 else pair[::-1]):
                t = time.perf_counter()
                with open(os.path.join(d, ".search", query_name(q, opts) if opts else q)) as f:
                    text = f.read()
                out.append((time.perf_counter() - t) * 1000)
                if opts:
                    sizes.append(estimate(text))
        print(f"search over {a.nodes} nodes, {a.queries} distinct queries, k=10, alternating:")
        print(f"  unbudgeted    p50 {pct(plain, 50):6.2f} ms  p99 {pct(plain, 99):6.2f} ms")
        print(f"  budget={a.budget:<5} p50 {pct(packed, 50):6.2f} ms  p99 {pct(packed, 99):6.2f} ms"
              f"  (answers {statistics.median(sizes):.0f} estimated tokens median, max {max(sizes)})")
        print(f"  ratio p50 {pct(packed, 50) / pct(plain, 50):.2f}x, p99 {pct(packed, 99) / pct(plain, 99):.2f}x")
    finally:
        subprocess.run([BIN, "umount", mnt], stdout=subprocess.DEVNULL)
        if work.startswith("/var/tmp/ctxfs-bench-budget-"):
            subprocess.run(["rm", "-rf", "--", work])


if __name__ == "__main__":
    main()
