#!/usr/bin/env python3
"""Bytes an agent reads to answer each BEIR SciFact query through a ctxfs mount.

Summary-first (what docs/AGENTS.md teaches): the memory map, the search file,
the top hit's .abstract.md and its content.md. Against the grep baselines an
agent without search would use, reading every content.md that grep -rl lists:
  - any keyword: `grep -rliwE 'kw1|kw2|...'` (stopwords removed);
  - two rarest keywords: files holding both of the query's two rarest keywords.
Every byte counted is read from the mount by a real process (cat, grep).
Nodes are written without .abstract.md/.overview.md: the daemon derives them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval import STOP, ingest, load, node_of  # noqa: E402
from mountutil import query_name, wait_sync  # noqa: E402
import re  # noqa: E402


def keywords(q):
    seen = []
    for t in re.findall(r"[a-z0-9]+", q.lower()):
        if t not in STOP and len(t) > 2 and t not in seen:
            seen.append(t)
    return seen


def doc_of(path):
    return re.search(r"/d([^/]+)/content\.md$", path).group(1)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def grep_l(args, root):
    r = subprocess.run(["grep", "-rliw", "--include=content.md"] + args + [root],
                       capture_output=True, text=True)
    return [l for l in r.stdout.splitlines() if l]


def judge_latency(mnt, queries):
    """What judging the results (confidence, lines, snippet) adds to a search,
    from the daemon's own timings in the JSON form, after the idle graph dump."""
    time.sleep(35)
    cat, total, first, retried = [], [], [], 0
    for q in queries.values():
        p = os.path.join(mnt, "accounts", "eval", ".search", query_name(q, "format=json"))
        t = time.perf_counter()
        with open(p) as f:
            j = json.load(f)
        cat.append((time.perf_counter() - t) * 1000)
        total.append(j["took_us"]["total"] / 1000)
        first.append(j["took_us"]["first_search"] / 1000)
        retried += len(j["tried"]) > 1
    print("| | p50 ms | p99 ms |\n|---|---|---|")
    for name, v in [("index search (first query)", first), ("search + judging + retries (daemon)", total),
                    ("`cat .search/Q?format=json` end to end", cat)]:
        v.sort()
        print(f"| {name} | {v[len(v) // 2]:.2f} | {v[int(len(v) * .99)]:.2f} |")
    print(f"\nretried with a respelled query: {retried}/{len(queries)}")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--dataset", default=os.environ.get("SCIFACT_DIR", os.path.join(here, "..", "datasets", "scifact")))
    ap.add_argument("--bin", default=os.environ.get("CTXFS_BIN", "target/release/ctxfs"))
    ap.add_argument("--embedder", default="hash")
    ap.add_argument("--model-dir", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--latency-only", action="store_true",
                    help="only the cost of judging results (confidence, lines), no byte counts")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.dataset, "corpus.jsonl")):
        sys.exit(f"SciFact not found in {args.dataset} (set SCIFACT_DIR or --dataset)")
    corpus, queries, qrels = load(args.dataset)
    queries = dict(list(queries.items())[: args.queries])
    df = {}
    for d in corpus:
        for t in set(re.findall(r"[a-z0-9]+", (d["title"] + " " + d["text"]).lower())):
            df[t] = df.get(t, 0) + 1

    tmp = tempfile.mkdtemp(prefix="ctxfs-tokens-", dir="/tmp")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cmd = [args.bin, "mount", mnt, "--data", data, "--embedder", args.embedder]
    if args.embedder == "minilm":
        cmd += ["--model-dir", os.path.abspath(args.model_dir)]
    subprocess.run(cmd, check=True)
    try:
        t = time.time()
        ingest(mnt, corpus, abstracts=False)
        wait_sync(mnt)
        print(f"ingested and indexed {len(corpus)} nodes in {time.time() - t:.1f}s", file=sys.stderr)
        if args.latency_only:
            judge_latency(mnt, queries)
            return
        user = os.path.join(mnt, "accounts", "eval", "users", "reader")
        root = os.path.join(user, "memories")
        tot = {"map": 0, "search": 0, "l0": 0, "content": 0, "any": 0, "rare": 0}
        hit1 = any_found = rare_found = answerable_right = answerable = 0
        for i, (qid, q) in enumerate(queries.items()):
            rel = {d for d, s in qrels[qid].items() if s > 0}
            # Summary-first.
            tot["map"] += len(read(os.path.join(user, "README.md")))
            res = read(os.path.join(user, ".search", query_name(q, "format=tsv")))
            tot["search"] += len(res)
            lines = res.decode().splitlines()
            if lines:
                top = os.path.join(mnt, lines[0].split("\t")[2])
                tot["l0"] += len(read(os.path.join(top, ".abstract.md")))
                tot["content"] += len(read(os.path.join(top, "content.md")))
                if top.rsplit("/d", 1)[1] in rel:
                    hit1 += 1
                    if lines[0].split("\t")[5] != "low":
                        answerable_right += 1
                if lines[0].split("\t")[5] != "low":
                    answerable += 1
            # grep baselines.
            kws = keywords(q)
            files = grep_l(["-E", "|".join(kws)], root) if kws else []
            tot["any"] += sum(len(read(f)) for f in files)
            any_found += any(doc_of(f) in rel for f in files)
            rare = sorted(kws, key=lambda k: df.get(k, 0))[:2]
            files = grep_l(["-e", rare[0]], root) if rare else []
            if len(rare) > 1 and files:
                r = subprocess.run(["grep", "-liw", "-e", rare[1]] + files, capture_output=True, text=True)
                files = [l for l in r.stdout.splitlines() if l]
            tot["rare"] += sum(len(read(f)) for f in files)
            rare_found += any(doc_of(f) in rel for f in files)
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{len(queries)} queries", file=sys.stderr)
    finally:
        subprocess.run([args.bin, "umount", mnt])
        subprocess.run(["rm", "-rf", tmp])
    n = len(queries)
    sf = tot["map"] + tot["search"] + tot["l0"] + tot["content"]
    sf_nomap = sf - tot["map"]
    print(f"\nSciFact, {len(corpus)} nodes, {n} queries, embedder {args.embedder}; bytes read per query (mean):\n")
    print("| reading | bytes/query | vs summary-first | a relevant doc among what was read |")
    print("|---|---|---|---|")
    print(f"| summary-first: map + search + top hit's L0 + content | {sf / n:,.0f} | 1.0× | {hit1 / n:.1%} (top hit) |")
    print(f"| summary-first without the map (read once per session) | {sf_nomap / n:,.0f} | {sf_nomap / sf:.2f}× | {hit1 / n:.1%} |")
    print(f"| grep -rl, any keyword, read every file | {tot['any'] / n:,.0f} | {tot['any'] / sf:.1f}× | {any_found / n:.1%} |")
    print(f"| grep -rl, both rarest keywords, read every file | {tot['rare'] / n:,.0f} | {tot['rare'] / sf:.1f}× | {rare_found / n:.1%} |")
    print(f"\nparts (bytes/query): map {tot['map'] / n:,.0f}, search file {tot['search'] / n:,.0f}, "
          f"L0 {tot['l0'] / n:,.0f}, content {tot['content'] / n:,.0f}")
    print(f"top hit not 'low': {answerable}/{n}, of which relevant: {answerable_right}")


if __name__ == "__main__":
    main()
