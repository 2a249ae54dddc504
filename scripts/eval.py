#!/usr/bin/env python3
"""Retrieval quality through the mount on BEIR SciFact (5,183 abstracts, 300
test claims): every document is committed as a node with the four-step
protocol, every query is read from `.search/`, and nDCG@10 / recall@100 are
computed against the qrels. A plain BM25 computed here in Python is the
baseline.

  python3 scripts/eval.py [--dataset DIR] [--bin target/release/ctxfs]
                          [--model-dir models/all-MiniLM-L6-v2] [--runs hash,minilm]
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import query_name, wait_sync  # noqa: E402
from collections import Counter, defaultdict

STOP = set("""a about above after again against all am an and any are as at be because been
before being below between both but by can could did do does doing down during each few for
from further had has have having he her here hers herself him himself his how i if in into is
it its itself just me more most my myself no nor not now of off on once only or other our ours
ourselves out over own same she should so some such than that the their theirs them themselves
then there these they this those through to too under until up very was we were what when where
which while who whom why will with would you your yours yourself yourselves""".split())


def tokens(s):
    return [t for t in re.findall(r"\w+", s.lower()) if t not in STOP]


def load(ds):
    corpus = [json.loads(l) for l in open(os.path.join(ds, "corpus.jsonl"))]
    queries = {}
    for l in open(os.path.join(ds, "queries.jsonl")):
        q = json.loads(l)
        queries[q["_id"]] = q["text"]
    qrels = defaultdict(dict)
    with open(os.path.join(ds, "qrels", "test.tsv")) as f:
        next(f)
        for line in f:
            qid, did, score = line.rstrip("\n").split("\t")
            qrels[qid][did] = int(score)
    return corpus, {q: queries[q] for q in qrels}, qrels


def ndcg10(ranked, rel):
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rel.values(), reverse=True)[:10]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall100(ranked, rel):
    hit = sum(1 for d in ranked[:100] if rel.get(d, 0) > 0)
    return hit / len([r for r in rel.values() if r > 0])


def score(runs, qrels):
    n = [ndcg10(runs.get(q, []), qrels[q]) for q in qrels]
    r = [recall100(runs.get(q, []), qrels[q]) for q in qrels]
    return sum(n) / len(n), sum(r) / len(r)


def python_bm25(corpus, queries, k1=1.2, b=0.75):
    docs = [Counter(tokens(d["title"] + " " + d["text"])) for d in corpus]
    lens = [sum(c.values()) for c in docs]
    avg = sum(lens) / len(lens)
    df = Counter()
    for c in docs:
        df.update(c.keys())
    N = len(docs)
    post = defaultdict(list)
    for i, c in enumerate(docs):
        for t, n in c.items():
            post[t].append((i, n))
    runs = {}
    for qid, q in queries.items():
        acc = defaultdict(float)
        for t in set(tokens(q)):
            if t not in df:
                continue
            idf = math.log(1 + (N - df[t] + 0.5) / (df[t] + 0.5))
            for i, n in post[t]:
                acc[i] += idf * n * (k1 + 1) / (n + k1 * (1 - b + b * lens[i] / avg))
        best = sorted(acc.items(), key=lambda x: -x[1])[:100]
        runs[qid] = [corpus[i]["_id"] for i, _ in best]
    return runs


def node_of(doc_id):
    return f"eval/users/reader/memories/scifact/d{doc_id}"


def ingest(mnt, corpus, abstracts=True):
    """Commit every document as a node; without `abstracts` the daemon derives L0/L1."""
    t = time.time()
    for i, d in enumerate(corpus):
        n = os.path.join(mnt, "accounts", node_of(d["_id"]))
        os.makedirs(n, exist_ok=True)
        with open(os.path.join(n, "content.md"), "w") as f:
            f.write(f"# {d['title']}\n\n{d['text']}\n")
        if abstracts:
            with open(os.path.join(n, ".abstract.md"), "w") as f:
                f.write(d["title"][:100].replace("\n", " "))
        with open(os.path.join(n, ".meta.json"), "w") as f:
            f.write('{"status":"ACTIVE"}')
        if (i + 1) % 1000 == 0:
            print(f"  committed {i + 1}/{len(corpus)}", file=sys.stderr)
    return time.time() - t


def run_queries(mnt, queries, mode):
    runs = {}
    lat = []
    scope = os.path.join(mnt, "accounts", "eval", ".search")
    for qid, q in queries.items():
        t = time.perf_counter()
        with open(os.path.join(scope, query_name(q, f"k=100&mode={mode}"))) as f:
            text = f.read()
        lat.append(time.perf_counter() - t)
        ids = []
        for line in text.splitlines():
            path = line.split("\t")[2]
            ids.append(path.rsplit("/d", 1)[1])
        runs[qid] = ids
    lat.sort()
    return runs, lat[len(lat) // 2] * 1000


def mount_and_eval(args, corpus, queries, qrels, embedder, modes):
    tmp = tempfile.mkdtemp(prefix="ctxfs-eval-", dir="/tmp")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cmd = [args.bin, "mount", mnt, "--data", data, "--embedder", embedder]
    if embedder == "minilm":
        cmd += ["--model-dir", args.model_dir]
    subprocess.run(cmd, check=True)
    out = {}
    try:
        secs = ingest(mnt, corpus)
        print(f"[{embedder}] ingested {len(corpus)} nodes in {secs:.1f}s", file=sys.stderr)
        t = time.time()
        wait_sync(mnt)
        idx = time.time() - t
        print(f"[{embedder}] index caught up {idx:.1f}s after the last commit", file=sys.stderr)
        for mode in modes:
            runs, p50 = run_queries(mnt, queries, mode)
            n, r = score(runs, qrels)
            out[mode] = (n, r, p50)
            print(f"[{embedder}] {mode}: nDCG@10 {n:.4f} recall@100 {r:.4f} (p50 {p50:.1f} ms)", file=sys.stderr)
    finally:
        subprocess.run([args.bin, "umount", mnt])
        subprocess.run(["rm", "-rf", tmp])
    return out


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--dataset", default=os.environ.get("SCIFACT_DIR", os.path.join(here, "..", "datasets", "scifact")))
    ap.add_argument("--bin", default=os.environ.get("CTXFS_BIN", "target/release/ctxfs"))
    ap.add_argument("--model-dir", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--runs", default="hash,minilm")
    args = ap.parse_args()
    args.model_dir = os.path.abspath(args.model_dir)
    if not os.path.exists(os.path.join(args.dataset, "corpus.jsonl")):
        sys.exit(f"SciFact not found in {args.dataset} (set SCIFACT_DIR or --dataset)")
    corpus, queries, qrels = load(args.dataset)
    print(f"SciFact: {len(corpus)} documents, {len(queries)} test queries", file=sys.stderr)
    rows = []
    n, r = score(python_bm25(corpus, queries), qrels)
    rows.append(("BM25 (Python, computed by this harness)", "-", n, r, None))
    for emb in args.runs.split(","):
        res = mount_and_eval(args, corpus, queries, qrels, emb,
                             ["vector", "lexical", "hybrid"] if emb == "hash" else ["vector", "hybrid"])
        label = "hashing fallback" if emb == "hash" else "MiniLM"
        for mode, (n, r, p50) in res.items():
            what = {"vector": f"{label} alone", "lexical": "ctxfs BM25 channel alone",
                    "hybrid": f"hybrid ({label} + BM25, scaled scores)"}[mode]
            rows.append((what, emb, n, r, p50))
    print("\n| ranking | embedder | nDCG@10 | recall@100 | query p50 (ms, k=100) |")
    print("|---|---|---|---|---|")
    for what, emb, n, r, p50 in rows:
        p = "-" if p50 is None else f"{p50:.1f}"
        print(f"| {what} | {emb} | {n:.4f} | {r:.4f} | {p} |")


if __name__ == "__main__":
    main()
