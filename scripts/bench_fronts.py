#!/usr/bin/env python3
"""FUSE requests a node write costs through each front, counted with the
daemon's metrics, against the AGENTS recipe for programs in the same run.

Rows (N nodes each, one writer, one category per front, no indexer):
  recipe    the four-step write in Python (open/write/close of the five
            files with the builtins, .meta.json last), as docs/AGENTS.md
            shows it for programs
  recipe-at the same with the node directory held open (os.O_PATH) and each
            file opened relative to it, as docs/AGENTS.md advises programs
  memtool   `ctxfs memtool` (the memory-tool protocol) fed N `create`
            commands on stdin, one process
  memtool-edit  `str_replace` on each node of the memtool row (read the
            committed version, commit over it in one batch line)
  mcp       `ctxfs mcp`'s `remember` tool is the same Front code as
            memtool's create; it is not driven here (its JSON-RPC framing
            adds no filesystem request)

A request the writer waits for is any but RELEASE (asynchronous in the
kernel). Reading the metrics costs a few requests itself: measured once
with no work between two reads and subtracted.

    python3 scripts/bench_fronts.py --bin target/release/ctxfs [--nodes 500]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ASYNC = {"release"}


def metrics(mnt):
    with open(os.path.join(mnt, ".ctxfs/metrics")) as f:
        text = f.read()
    out = {}
    for m in re.finditer(r'^ctxfs_requests_total\{op="(\w+)"\} (\d+)$', text, re.M):
        out[m.group(1)] = int(m.group(2))
    return out


def diff(a, b):
    return {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}


def recipe(mnt, n):
    base = os.path.join(mnt, "accounts/bench/users/u/memories/recipe")
    for i in range(n):
        d = os.path.join(base, f"n{i}")
        os.makedirs(d, exist_ok=True)
        text = f"Node {i} of the recipe row: a short memory of one line.\n"
        for name, data in (("content.md", text), (".relations.json", "[]\n"),
                           (".abstract.md", f"node {i}\n"), (".overview.md", "# overview\n"),
                           (".meta.json", '{"status": "ACTIVE"}\n')):
            with open(os.path.join(d, name), "w") as f:
                f.write(data)


def recipe_at(mnt, n):
    base = os.path.join(mnt, "accounts/bench/users/u/memories/recipe-at")
    for i in range(n):
        d = os.path.join(base, f"n{i}")
        os.makedirs(d, exist_ok=True)
        fd = os.open(d, os.O_PATH | os.O_DIRECTORY)
        at = lambda name, flags: os.open(name, flags, 0o644, dir_fd=fd)  # noqa: E731
        text = f"Node {i} of the recipe-at row: a short memory of one line.\n"
        for name, data in (("content.md", text), (".relations.json", "[]\n"),
                           (".abstract.md", f"node {i}\n"), (".overview.md", "# overview\n"),
                           (".meta.json", '{"status": "ACTIVE"}\n')):
            with open(name, "w", buffering=65536, opener=at) as f:
                f.write(data)
        os.close(fd)


def memtool_session(bin_path, mnt, cmds):
    """One `ctxfs memtool` process fed `cmds` one at a time, each answered ok."""
    p = subprocess.Popen([bin_path, "memtool", "--mount", mnt, "--scope", "accounts/bench/users/u"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for cmd in cmds:
        p.stdin.write(json.dumps(cmd) + "\n")
        p.stdin.flush()
        a = json.loads(p.stdout.readline())
        assert a["ok"], a
    p.stdin.close()
    p.wait()


def memtool(bin_path, mnt, n):
    memtool_session(bin_path, mnt, ({"command": "create", "path": f"/memories/tool/n{i}.md",
                                     "file_text": f"Node {i} of the memtool row: a short memory of one line.\n"}
                                    for i in range(n)))


def memtool_edit(bin_path, mnt, n):
    """`str_replace` on each node the memtool row made: read the committed
    version, commit the edit over it (one batch line with if_version)."""
    memtool_session(bin_path, mnt, ({"command": "str_replace", "path": f"/memories/tool/n{i}.md",
                                     "old_str": "memtool row", "new_str": "edited row"}
                                    for i in range(n)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--nodes", type=int, default=500)
    args = ap.parse_args()
    bin_path = os.path.abspath(args.bin)
    tmp = tempfile.mkdtemp(prefix="ctxfs-bench-fronts-", dir="/tmp")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cfg = os.path.join(tmp, "config.toml")
    with open(cfg, "w") as f:
        f.write('[[account]]\nid = "bench"\nwriters = [0]\n')
    subprocess.run([bin_path, "mount", mnt, "--data", data, "--config", cfg, "--no-index"], check=True)
    try:
        os.makedirs(os.path.join(mnt, "accounts/bench/users/u/memories"), exist_ok=True)
        a, b = metrics(mnt), metrics(mnt)
        probe = sum(v for k, v in diff(a, b).items() if k not in ASYNC)
        rows = []
        for name, work in (("recipe", lambda: recipe(mnt, args.nodes)),
                           ("recipe-at", lambda: recipe_at(mnt, args.nodes)),
                           ("memtool", lambda: memtool(bin_path, mnt, args.nodes)),
                           ("memtool-edit", lambda: memtool_edit(bin_path, mnt, args.nodes))):
            before = metrics(mnt)
            t = time.perf_counter()
            work()
            secs = time.perf_counter() - t
            d = diff(before, metrics(mnt))
            sync = (sum(v for k, v in d.items() if k not in ASYNC) - probe) / args.nodes
            per_op = {k: round(v / args.nodes, 2) for k, v in sorted(d.items())}
            rows.append((name, sync, args.nodes / secs, per_op))
            print(f"  {name}: {sync:.1f} requests waited for a node, {args.nodes / secs:.0f} nodes/s, {per_op}",
                  file=sys.stderr)
        base = rows[0]
        print(f"\n{args.nodes} nodes a row, one writer, no indexer\n")
        print("| front | requests waited for, per node | vs the recipe | nodes/s | vs the recipe |")
        print("|---|---|---|---|---|")
        for name, sync, rate, _ in rows:
            print(f"| {name} | {sync:.1f} | {sync / base[1]:.2f}× | {rate:.0f} | {rate / base[2]:.2f}× |")
    finally:
        subprocess.run([bin_path, "umount", mnt])
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
