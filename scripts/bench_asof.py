#!/usr/bin/env python3
"""Memory as of a time: what reading the past costs against reading now.

  python3 scripts/bench_asof.py [--nodes 10000] [--versions 3] [--rounds 3]
  python3 scripts/bench_asof.py --search [--embedder hash|minilm] [--queries 30]

Commits N nodes (~1 KB of text each) through `.ctxfs/batch` on a fresh
mount (`--no-index`: the view does not use the index), then N-1 more
versions of every node, noting the time after the first version. Then, in
the same run and alternating which goes first, on the live tree and on
`accounts/acme/.as-of/T/` (every node at its first version):

  - the first `ls` of the view (it is built then: every node record read,
    the version at T found by binary search), against `ls` of the account;
  - `grep -rl WORD` of the whole tree (every content.md opened and read);
  - `cat` of every `content.md` by path;
  - `find -name content.md`.

With `--search` the mount indexes (the hashing embedder unless
`--embedder minilm`), each version waits for `.ctxfs/sync` before the
next (versions spaced in time, as the indexer sees them), and the rows are
the latency of `cat .search/QUERY` at the account, live and in the view:
the first search of the view (its exact index built) and the median and
p90 over the warm queries.

Prints `live  as-of  ratio` per row (the live tree is the baseline), the
medians over the rounds. Figures go to docs/BENCHMARKS.md with this
command.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mountutil import wait_sync  # noqa: E402
BIN = os.environ.get("CTXFS_BIN", os.path.join(HERE, "../target/release/ctxfs"))
WORDS = ("kettle tea water boil morning garden rain bicycle train ticket station coffee "
         "market bread cheese river bridge window lamp desk paper letter stamp garden "
         "mountain snow boots jacket scarf piano song choir evening candle dinner").split()


def node(i, v):
    rnd = random.Random(i * 1000 + v)
    lines = [" ".join(rnd.choice(WORDS) for _ in range(14)) + "." for _ in range(12)]
    if i % 100 == 0:
        lines[3] += f" zebra{v}"
    return {"node": f"users/u{i % 20}/memories/c{(i // 20) % 50}/n{i}",
            "content": "\n".join(lines) + "\n",
            "abstract": " ".join(lines[0].split()[:10]),
            "overview": f"# note {i} v{v}\n{lines[1]}",
            "meta": {"status": "ACTIVE"}}


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def run(cmd, cwd=None):
    subprocess.run(cmd, shell=True, check=False, cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--search", action="store_true", help="search latency, live against the view")
    ap.add_argument("--embedder", default="hash")
    ap.add_argument("--queries", type=int, default=30)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctxfs-bench-asof-", dir="/var/tmp")
    mnt, data = os.path.join(work, "mnt"), os.path.join(work, "data")
    os.makedirs(mnt)
    index = ["--embedder", a.embedder] if a.search else ["--no-index"]
    subprocess.run([BIN, "mount", mnt, "--data", data, *index], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        acct = os.path.join(mnt, "accounts/acme")
        os.makedirs(acct, exist_ok=True)
        t_then = None
        t = time.time()
        for v in range(1, a.versions + 1):
            for start in range(0, a.nodes, 2000):
                lines = "".join(json.dumps(node(i, v)) + "\n"
                                for i in range(start, min(a.nodes, start + 2000)))
                with open(os.path.join(acct, ".ctxfs/batch"), "w") as f:
                    f.write(lines)
            if a.search:
                wait_sync(mnt)
            if v == 1:
                time.sleep(0.05)
                t_then = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + \
                    f".{int(time.time() * 1e9) % 1_000_000_000:09d}Z"
                time.sleep(0.05)
        print(f"{a.nodes} nodes x {a.versions} versions committed in {time.time() - t:.1f} s; "
              f"T = {t_then}", file=sys.stderr)
        view = os.path.join(acct, ".as-of", t_then)
        trees = {"live": acct, "as-of": view}
        if a.search:
            return search_rows(a, trees)
        paths = {k: [os.path.join(d, node(i, 1)["node"], "content.md") for i in range(a.nodes)]
                 for k, d in trees.items()}

        def cat_all(k):
            for p in paths[k]:
                with open(p, "rb") as f:
                    f.read()

        rows = {"first ls (view built)": {}, "grep -rl WORD (warm)": {},
                "cat every content.md by path (warm)": {}, "find -name content.md (warm)": {}}
        first = {}
        for k in ("live", "as-of"):
            first[k] = timed(lambda: os.listdir(os.path.join(trees[k], "users")))
        rows["first ls (view built)"] = {k: [v] for k, v in first.items()}
        for k in rows:
            if k != "first ls (view built)":
                rows[k] = {"live": [], "as-of": []}
        # One warm-up of each.
        for k in trees:
            run(f"grep -rl zebra1 '{trees[k]}/users'")
            cat_all(k)
        found = {}
        for r in range(a.rounds):
            order = ("live", "as-of") if r % 2 == 0 else ("as-of", "live")
            for k in order:
                rows["grep -rl WORD (warm)"][k].append(
                    timed(lambda: run(f"grep -rl zebra1 '{trees[k]}/users'")))
                rows["cat every content.md by path (warm)"][k].append(timed(lambda: cat_all(k)))
                rows["find -name content.md (warm)"][k].append(
                    timed(lambda: run(f"find '{trees[k]}/users' -name content.md")))
        for k in trees:
            out = subprocess.run(f"grep -rl zebra1 '{trees[k]}/users' | wc -l", shell=True,
                                 capture_output=True, text=True).stdout.strip()
            found[k] = out
        print(f"files holding the word of version 1: live {found['live']}, as-of {found['as-of']} "
              f"(expected 0 and {a.nodes // 100})", file=sys.stderr)
        print(f"{'workload':40} {'live':>9} {'as-of':>9} {'ratio':>7}")
        for name, r in rows.items():
            lv, av = statistics.median(r["live"]), statistics.median(r["as-of"])
            print(f"{name:40} {lv:8.3f}s {av:8.3f}s {av / lv:6.2f}x")
    finally:
        subprocess.run([BIN, "umount", mnt], check=False, stdout=subprocess.DEVNULL)


def search_rows(a, trees):
    rnd = random.Random(7)
    queries = [" ".join(rnd.sample(WORDS, 3)) for _ in range(a.queries)]

    def search(k, q):
        with open(os.path.join(trees[k], ".search", q)) as f:
            return f.read()

    first = {k: timed(lambda: search(k, "kettle garden")) for k in ("live", "as-of")}
    lat = {"live": [], "as-of": []}
    hits = {"live": 0, "as-of": 0}
    for r in range(a.rounds):
        for q in queries:
            order = ("live", "as-of") if r % 2 == 0 else ("as-of", "live")
            for k in order:
                t = time.perf_counter()
                out = search(k, q)
                lat[k].append(time.perf_counter() - t)
                hits[k] += bool(out.strip())
    print(f"queries answered: live {hits['live']}, as-of {hits['as-of']} of "
          f"{a.rounds * len(queries)} each", file=sys.stderr)

    def p(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    print(f"{'workload':40} {'live':>9} {'as-of':>9} {'ratio':>7}")
    rows = [("first search (view's index built)", first["live"], first["as-of"]),
            ("warm search p50", p(lat["live"], 0.5), p(lat["as-of"], 0.5)),
            ("warm search p90", p(lat["live"], 0.9), p(lat["as-of"], 0.9))]
    for name, lv, av in rows:
        print(f"{name:40} {lv * 1000:7.1f}ms {av * 1000:7.1f}ms {av / lv:6.2f}x")


if __name__ == "__main__":
    main()
