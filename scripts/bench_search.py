#!/usr/bin/env python3
"""Search benchmarks through a real mount, on nodes made of SciFact sentences.

  python3 scripts/bench_search.py [--nodes 100000] [--minilm-nodes N] [--embedders hash,minilm]
                                  [--lag-seconds 60] [--lag-rate 20] [--writers 8] [--messages N]

For each embedder: commit N nodes (four-step protocol), wait for
`.ctxfs/sync`, then
  - indexing throughput (nodes/s from the first commit until the indexer
    has caught up, with 8 writers committing; and offline `ctxfs reindex`),
  - `cat DIR/.search/QUERY` end-to-end latency (p50/p99, distinct queries;
    and with `mode=tree`, the hierarchical search),
    with the query-embedding share from the JSON form, beside `grep -rli`
    for one query word over the same nodes as plain files (the baseline an
    agent would otherwise use),
  - mount-to-first-result time with the index on disk,
  - index lag (commit -> searchable, p50/p95) at a steady commit rate.
Figures go to docs/BENCHMARKS.md with the command that produced them.
"""
import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import query_name, wait_sync  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("CTXFS_BIN", os.path.join(HERE, "../target/release/ctxfs"))
DS = os.environ.get("SCIFACT_DIR", os.path.join(HERE, "..", "datasets", "scifact"))
MODEL = os.path.abspath(os.environ.get("CTXFS_MODEL_DIR", os.path.join(HERE, "../models/all-MiniLM-L6-v2")))


def sentences(text):
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 20]


def corpus(n):
    docs = [json.loads(l) for l in open(os.path.join(DS, "corpus.jsonl"))]
    out = []
    for w in (2, 1, 3, 4):
        for d in docs:
            s = sentences(d["text"])
            for i in range(0, max(1, len(s) - w + 1)):
                chunk = " ".join(s[i:i + w])
                if chunk:
                    out.append((d["title"], chunk))
                if len(out) >= n:
                    return out
    if len(out) < n:
        sys.exit(f"only {len(out)} nodes can be made from SciFact")
    return out


def queries():
    return [json.loads(l)["text"] for l in open(os.path.join(DS, "queries.jsonl"))]


def node(i):
    return f"bench/users/u/memories/c{i % 100:02d}/n{i}"


def write_nodes(root, nodes, commit, start=0, step=1):
    """Write each node's files under root (the j-th is node start + j * step);
    with `commit`, also .meta.json (the commit point through a mount).
    Returns the seconds taken."""
    t = time.time()
    for j, (title, text) in enumerate(nodes):
        i = start + j * step
        n = os.path.join(root, node(i))
        os.makedirs(n, exist_ok=True)
        with open(os.path.join(n, "content.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(n, ".abstract.md"), "w") as f:
            f.write(title[:100])
        if commit:
            with open(os.path.join(n, ".meta.json"), "w") as f:
                f.write('{"status":"ACTIVE"}')
            if step == 1 and (i + 1) % 10000 == 0:
                print(f"    {i + 1} committed ({(i + 1 - start) / (time.time() - t):.0f}/s)", file=sys.stderr)
    return time.time() - t


def commit_parallel(root, nodes, writers):
    """Commit `nodes` with `writers` processes (node i by writer i % writers),
    so the indexer gets more than one writer's commit rate. Returns seconds."""
    t = time.time()
    jobs = [(root, nodes[w::writers], True, w, writers) for w in range(writers)]
    with multiprocessing.Pool(writers) as p:
        p.starmap(write_nodes, jobs)
    return time.time() - t


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * q)))]


def status(mnt):
    with open(os.path.join(mnt, ".ctxfs/status")) as f:
        return json.load(f)


def mount(mnt, data, emb, config=None):
    cmd = [BIN, "mount", mnt, "--data", data, "--embedder", emb]
    if emb == "minilm":
        cmd += ["--model-dir", MODEL]
    if config:
        cmd += ["--config", config]
    subprocess.run(cmd, check=True)


MESSAGES_PER_CONVERSATION = 50


def write_conversations(mnt, texts):
    """Store `texts` as conversations of 50 messages in the bench user's
    inbox (two speakers, dated), so search ranks them beside the nodes.
    The mount's [llm] points at a closed port: the messages are indexed at
    close whatever extraction does. Returns the seconds taken."""
    inbox = os.path.join(mnt, "accounts", "bench", "users", "u", "inbox")
    t = time.time()
    per = MESSAGES_PER_CONVERSATION
    for c in range(0, len(texts), per):
        msgs = [{"role": "user" if j % 2 == 0 else "assistant", "content": text,
                 "ts": f"2026-03-{1 + (c // per) % 28:02d}T10:{j % 60:02d}:00Z"}
                for j, (_, text) in enumerate(texts[c:c + per])]
        with open(os.path.join(inbox, f"c{c // per}.json"), "w") as f:
            json.dump({"messages": msgs}, f)
    return time.time() - t


def umount(mnt):
    subprocess.run([BIN, "umount", mnt], check=True)


def latency(mnt, qs, opts="k=10"):
    scope = os.path.join(mnt, "accounts/bench/.search")
    tot, emb = [], []
    for q in qs:
        t = time.perf_counter()
        with open(os.path.join(scope, query_name(q, opts))) as f:
            f.read()
        tot.append((time.perf_counter() - t) * 1000)
    if opts != "k=10":
        return tot, []
    retried = 0
    for q in qs[:200]:
        with open(os.path.join(scope, query_name(q + " x", "k=10&format=json"))) as f:
            j = json.load(f)
        emb.append(j["took_us"]["query_embedding"] / 1000)
        retried += len(j["tried"]) > 1
    print(f"  {retried} of 200 JSON queries were retried with a relaxed variant", file=sys.stderr)
    return tot, emb


def grep_baseline(plain, qs):
    """grep -rli for the longest word of each query over the same nodes as plain files."""
    lat = []
    for q in qs[:20]:
        words = re.findall(r"[a-zA-Z]{6,}", q)
        w = max(words, key=len) if words else "cell"
        t = time.perf_counter()
        subprocess.run(["grep", "-rli", w, plain], stdout=subprocess.DEVNULL)
        lat.append((time.perf_counter() - t) * 1000)
    return lat


def lag_run(mnt, seconds, rate):
    """A writer at a steady rate; the daemon reports commit->searchable lag."""
    stop = time.time() + seconds
    i = 10_000_000
    nxt = time.time()
    while time.time() < stop:
        n = os.path.join(mnt, "accounts", node(i))
        os.makedirs(n, exist_ok=True)
        with open(os.path.join(n, "content.md"), "w") as f:
            f.write(f"steady commit {i}: the lag benchmark writes one sentence per node.\n")
        with open(os.path.join(n, ".meta.json"), "w") as f:
            f.write('{"status":"ACTIVE"}')
        i += 1
        nxt += 1.0 / rate
        time.sleep(max(0, nxt - time.time()))
    wait_sync(mnt)
    return i - 10_000_000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--minilm-nodes", type=int, default=None,
                    help="nodes for the MiniLM run (default: --nodes); MiniLM embeds ~20 MFLOP per token")
    ap.add_argument("--embedders", default="hash,minilm")
    ap.add_argument("--lag-seconds", type=int, default=60,
                    help="long enough that the daemon's last 1,000 lag samples are all from this run")
    ap.add_argument("--lag-rate", type=float, default=20)
    ap.add_argument("--writers", type=int, default=8,
                    help="processes committing the nodes (the indexer must not wait for one writer)")
    ap.add_argument("--keep", help="keep data dirs under this directory")
    ap.add_argument("--messages", type=int, default=0,
                    help="conversation messages stored beside the nodes (in conversations of 50; "
                         "searched with them)")
    args = ap.parse_args()
    nodes = corpus(args.nodes + args.messages)
    nodes, said = nodes[:args.nodes], nodes[args.nodes:]
    qs = queries()
    base = tempfile.mkdtemp(prefix="ctxfs-bench-search-", dir="/tmp")
    print(f"{len(nodes)} nodes from SciFact sentences, {len(qs)} distinct queries", file=sys.stderr)
    results = {}
    try:
        for emb in args.embedders.split(","):
            mnt, data = os.path.join(base, f"mnt-{emb}"), os.path.join(base, f"data-{emb}")
            os.makedirs(mnt)
            r = results[emb] = {}
            mine = nodes[: args.minilm_nodes] if emb == "minilm" and args.minilm_nodes else nodes
            r["nodes"] = len(mine)
            config = None
            if said:
                config = os.path.join(base, "config.toml")
                with open(config, "w") as f:
                    f.write('[llm]\nurl = "http://127.0.0.1:9/v1"\nmodel = "none"\nsummaries = false\n'
                            'max_attempts = 1\n')
            mount(mnt, data, emb, config)
            root = os.path.join(mnt, "accounts")
            t0 = time.time()
            secs = commit_parallel(root, mine, args.writers)
            r["writers"] = args.writers
            r["commit_per_s"] = len(mine) / secs
            wait_sync(mnt)
            if said:
                os.makedirs(os.path.join(root, "bench", "users", "u"), exist_ok=True)
                ms = write_conversations(mnt, said)
                r["messages"] = len(said)
                print(f"[{emb}] stored {len(said)} messages in {ms:.0f}s", file=sys.stderr)
                wait_sync(mnt)
            r["index_caught_up_s"] = time.time() - t0
            r["online_index_per_s"] = len(mine) / (time.time() - t0)
            print(f"[{emb}] committed {len(mine)} in {secs:.0f}s with {args.writers} writers, indexed {r['online_index_per_s']:.0f} nodes/s overall", file=sys.stderr)
            if said:
                # The messages are searched with the nodes: share of top-10
                # results that are messages, over 50 queries.
                n_msg = n_all = 0
                for q in qs[:50]:
                    with open(os.path.join(mnt, "accounts/bench/.search",
                                           query_name(q, "k=10&format=json"))) as f:
                        res = json.load(f)["results"]
                    n_all += len(res)
                    n_msg += sum(1 for x in res if "conversation" in x)
                r["message_share_of_results"] = n_msg / max(1, n_all)
                print(f"[{emb}] {n_msg} of {n_all} top-10 results are messages", file=sys.stderr)
            tot, embd = latency(mnt, qs[:600])
            r["search_ms"] = {"p50": pct(tot, .5), "p99": pct(tot, .99), "n": len(tot)}
            r["query_embedding_ms"] = {"p50": pct(embd, .5), "p99": pct(embd, .99)}
            # Hierarchical (mode=tree): the directories first, then inside the best 3.
            tree, _ = latency(mnt, qs[:300], "k=10&mode=tree")
            r["tree_search_ms"] = {"p50": pct(tree, .5), "p99": pct(tree, .99), "n": len(tree)}
            print(f"[{emb}] mode=tree search p50 {pct(tree, .5):.2f} ms p99 {pct(tree, .99):.2f} ms",
                  file=sys.stderr)
            plain = os.path.join(base, f"plain-{emb}")
            write_nodes(plain, mine, commit=False)
            g = grep_baseline(os.path.join(plain, "bench"), qs)
            r["grep_rli_ms"] = {"p50": pct(g, .5)}
            print(f"[{emb}] search p50 {pct(tot, .5):.2f} ms p99 {pct(tot, .99):.2f} ms "
                  f"(query embedding p50 {pct(embd, .5):.2f} ms); grep -rli p50 {pct(g, .5):.0f} ms "
                  f"-> {pct(g, .5) / pct(tot, .5):.0f}x faster than grep", file=sys.stderr)
            if emb == "minilm":
                n = lag_run(mnt, args.lag_seconds, args.lag_rate)
                s = status(mnt)["indexer"]["recent_lag_ms"]
                r["lag"] = {"commits": n, "rate": args.lag_rate, "p50_ms": s["p50"], "p95_ms": s["p95"]}
                print(f"[{emb}] lag at {args.lag_rate}/s: p50 {s['p50']} ms p95 {s['p95']} ms over the last {s['samples']} commits", file=sys.stderr)
            umount(mnt)
            # Mount with the index on disk: time to the first search answer.
            t = time.time()
            mount(mnt, data, emb, config)
            tm = time.time() - t
            with open(os.path.join(mnt, "accounts/bench/.search", query_name(qs[0], "k=10"))) as f:
                first = f.read()
            r["mount_s"] = tm
            r["mount_to_first_result_s"] = time.time() - t
            print(f"[{emb}] remount: ready {tm:.2f}s, first result {r['mount_to_first_result_s']:.2f}s ({len(first.splitlines())} lines)", file=sys.stderr)
            umount(mnt)
            if args.keep:
                shutil.copytree(data, os.path.join(args.keep, f"data-{emb}"), dirs_exist_ok=True)
            # Offline reindex throughput (hashing only: MiniLM's vectors are
            # cached in the store by content hash, so its reindex measures the cache).
            if emb != "hash":
                continue
            t = time.time()
            cmd = [BIN, "reindex", "--data", data, "--embedder", emb]
            if emb == "minilm":
                cmd += ["--model-dir", MODEL]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            r["reindex_per_s"] = len(mine) / (time.time() - t)
            print(f"[{emb}] ctxfs reindex: {r['reindex_per_s']:.0f} nodes/s", file=sys.stderr)
    finally:
        for d in os.listdir(base):
            if d.startswith("mnt-"):
                subprocess.run([BIN, "umount", os.path.join(base, d)], stderr=subprocess.DEVNULL)
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
