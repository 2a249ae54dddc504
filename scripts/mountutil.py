"""Helpers shared by the benchmark and evaluation scripts."""
import json
import os
import sys


def wait_sync(mnt):
    """Read .ctxfs/sync until it says ok (it fails with ETIMEDOUT after its timeout)."""
    while True:
        try:
            with open(os.path.join(mnt, ".ctxfs/sync")) as f:
                assert f.read() == "ok\n"
                return
        except TimeoutError:
            with open(os.path.join(mnt, ".ctxfs/status")) as f:
                s = json.load(f)
            print(f"  still indexing: outbox {s['outbox_depth']}, indexed {s['indexer']['indexed_nodes']}", file=sys.stderr)


def query_name(q, opts):
    """A search file name for query `q` with options, within NAME_MAX."""
    q = q.replace("/", " ").replace("\0", " ").strip()
    name = f"{q}?{opts}"
    while len(name.encode()) > 250:
        q = q[:-1]
        name = f"{q}?{opts}"
    return name
