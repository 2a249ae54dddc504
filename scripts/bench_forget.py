#!/usr/bin/env python3
"""The cost of forgetting: delete nodes through the mount, then `ctxfs compact`.

  python3 scripts/bench_forget.py --data DIR [--delete 1000] [--work /var/tmp/ctxfs-forget]

DIR is a data dir with nodes under accounts/bench (for example the one
`scripts/bench_search.py --keep K` leaves in K/data-hash); it is copied to
the work dir first and not changed. The script mounts the copy, deletes
--delete nodes with `rm -r`, waits for `.ctxfs/sync` (the indexer applies
the deletes), unmounts, then measures `ctxfs compact` (wall time, bytes read
and written, peak RSS) beside the floor measured in the same run: `cp` of
the store file (reading and writing every byte of it once).
Figures go to docs/BENCHMARKS.md with the command that produced them.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import wait_sync  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("CTXFS_BIN", os.path.join(HERE, "../target/release/ctxfs"))


def io_of_children():
    """(bytes read, bytes written, peak RSS in KiB) of waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_inblock * 512, r.ru_oublock * 512, r.ru_maxrss


def timed(cmd):
    """Run `cmd`; wall seconds, bytes read and written (page cache dropped first)."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    r0, w0, _ = io_of_children()
    t = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    secs = time.time() - t
    r1, w1, rss = io_of_children()
    return secs, r1 - r0, w1 - w0, rss, out.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--delete", type=int, default=1000)
    ap.add_argument("--work", default="/var/tmp/ctxfs-forget")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    data, mnt = os.path.join(a.work, "data"), os.path.join(a.work, "mnt")
    shutil.copytree(a.data, data)
    os.makedirs(mnt)
    subprocess.run([BIN, "mount", mnt, "--data", data, "--embedder", "hash"], check=True)
    try:
        wait_sync(mnt)
        root = os.path.join(mnt, "accounts/bench")
        nodes = []
        for dirpath, dirnames, filenames in os.walk(root):
            if ".meta.json" in filenames:
                nodes.append(dirpath)
                dirnames[:] = []
        nodes.sort()
        gone = nodes[:: max(1, len(nodes) // a.delete)][: a.delete]
        t = time.time()
        for n in gone:
            shutil.rmtree(n)
        deleted_s = time.time() - t
        wait_sync(mnt)
        print(f"{len(nodes)} nodes; deleted {len(gone)} in {deleted_s:.1f}s through the mount", file=sys.stderr)
    finally:
        subprocess.run([BIN, "umount", mnt], check=True)
    store = os.path.join(data, "ctxfs.redb")
    size = os.path.getsize(store)
    cp_s, cp_r, cp_w, _, _ = timed(["cp", store, store + ".copy"])
    os.remove(store + ".copy")
    c_s, c_r, c_w, rss, said = timed([BIN, "compact", "--data", data])
    print(said, file=sys.stderr)
    after = os.path.getsize(store)
    fsck = subprocess.run([BIN, "fsck", "--data", data], capture_output=True, text=True)
    print(f"store {size / 1e6:.0f} MB -> {after / 1e6:.0f} MB; fsck: {fsck.stdout.strip().splitlines()[-1]}")
    print(f"{'':32}{'seconds':>10}{'read MB':>10}{'written MB':>12}")
    print(f"{'cp of the store (floor)':32}{cp_s:>10.2f}{cp_r / 1e6:>10.0f}{cp_w / 1e6:>12.0f}")
    print(f"{'ctxfs compact':32}{c_s:>10.2f}{c_r / 1e6:>10.0f}{c_w / 1e6:>12.0f}")
    print(f"compact / floor: {c_s / cp_s:.2f}x time; peak RSS of the children {rss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
