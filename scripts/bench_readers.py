#!/usr/bin/env python3
"""The readers' mount (a prototype): the same daemon mounted a second time,
read-only, showing only directories and committed node files; `OPEN`
answers ENOSYS there, so the kernel sends no OPEN/RELEASE and keeps every
file's pages. Measured warm against the main mount and a local directory
holding the same files, in one run:

  find, grep -r WORD, cat of every .abstract.md (as bench.py --only tree),
  and open+close of one cached file per call.

    python3 scripts/bench_readers.py [--nodes 10000]
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from mountutil import wait_sync  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--work", default="/var/tmp/ctxfs-bench-readers")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    local = os.path.join(args.work, "local")
    mnt = os.path.join(args.work, "mnt")
    ro = os.path.join(args.work, "ro")
    for d in (mnt, ro):
        os.makedirs(d)
    env = dict(os.environ, CTXFS_READERS_MOUNT=ro)
    subprocess.run([bench.BIN, "mount", mnt, "--data", os.path.join(args.work, "data"),
                    "--embedder", "hash"], check=True, stdout=subprocess.DEVNULL, env=env)
    try:
        ids = list(range(args.nodes))
        bench.populate(local, ids, 8, False)
        t = bench.populate(os.path.join(mnt, "accounts"), ids, 8, False)
        wait_sync(mnt)
        print(f"ctxfs bench (readers' mount): {args.nodes} nodes committed in {t:.1f}s")
        bases = {"local": local, "main": os.path.join(mnt, "accounts"), "readers": os.path.join(ro, "accounts")}
        rows = []
        # The node abstracts only (7 levels below accounts/): the main mount
        # also holds generated summaries of users and categories.
        ops = dict(bench.TREE_OPS)
        ops["cat .abstract.md"] = "find {d} -mindepth 7 -name .abstract.md -exec cat {{}} + | wc -l"
        for name, cmd in ops.items():
            got = {}
            for k, d in bases.items():
                bench.timed(cmd.format(d=d), 1)  # warm the caches
                got[k] = bench.timed(cmd.format(d=d))
            rows.append((name, got))
        f = os.path.join(bench.node_rel(0), ".abstract.md")
        per = {k: bench.per_call_us(os.path.join(d, f))[0] for k, d in bases.items()}
        # The readers' mount shows the tree's directories and committed node
        # files as the main mount does (not its generated README.md files
        # or inboxes), and every workload finds the same lines.
        def tree(d):
            out = subprocess.run(f"cd {d} && find . | sort", shell=True, capture_output=True, text=True).stdout
            # Generated files (summaries of users and categories, headers,
            # README.md) and inboxes are the main mount's alone.
            return [p for p in out.split() if not p.endswith(("/README.md", "/inbox", "/.header.md"))
                    and "/inbox/" not in p
                    and not (p.count("/") <= 6 and p.endswith(("/.abstract.md", "/.overview.md")))]
        same = tree(bases["main"]) == tree(bases["readers"])
        for name, cmd in ops.items():
            if name == "find":
                continue  # the generated files are in main's count
            got = {k: subprocess.run(cmd.format(d=bases[k]), shell=True, capture_output=True, text=True).stdout
                   for k in ("main", "readers")}
            same = same and got["main"] == got["readers"]
        print(f"\nwarm, {args.nodes} ACTIVE nodes (the same tree and answers on both mounts: {same})")
        if not same:
            sys.exit("the readers' mount differs from the main mount")
        print(f"  {'workload':22} {'local':>9} {'main':>9} {'readers':>9} {'main/local':>11} {'readers/local':>14} {'main/readers':>13}")
        for name, g in rows:
            print(f"  {name:22} {g['local']:8.3f}s {g['main']:8.3f}s {g['readers']:8.3f}s "
                  f"{g['main'] / g['local']:10.2f}x {g['readers'] / g['local']:13.2f}x {g['main'] / g['readers']:12.2f}x")
        print(f"  {'open+close, us/call':22} {per['local']:8.2f}  {per['main']:8.2f}  {per['readers']:8.2f}  "
              f"{per['main'] / per['local']:10.1f}x {per['readers'] / per['local']:13.1f}x {per['main'] / per['readers']:12.2f}x")
    finally:
        subprocess.run([bench.BIN, "umount", mnt], stdout=subprocess.DEVNULL)
        subprocess.run(["fusermount3", "-u", ro], stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
