#!/usr/bin/env python3
"""Crash torture: writers stream four-step commits (and some deletes) through
the mount while the daemon is killed with SIGKILL at random moments. After
each remount: `ctxfs fsck` is clean, every commit whose close returned 0 is
present with its exact content (unless a later acknowledged delete removed
it), every acknowledged delete is gone, no PENDING node is visible, and
search agrees with the store (once `.ctxfs/sync` returns, a sample of the
present nodes is found by its unique word and no deleted node is returned).

Usage: scripts/crash-torture.py [--rounds N] [--writers W] [--seed S]
Prints rounds survived and commits lost (must be 0); exits 1 on any loss.
"""
import argparse
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("CTXFS_BIN", os.path.join(ROOT, "target", "release", "ctxfs"))


def writer(base, wid, rnd_seed, log_path, stop_at):
    """Append 'C path body' after each acknowledged commit, 'D path' after
    each acknowledged delete. Stops at the first error (the daemon died)."""
    rnd = random.Random(rnd_seed)
    i = 0
    with open(log_path, "a", buffering=1) as log:
        while time.time() < stop_at:
            i += 1
            node = f"acme/users/w{wid}/memories/t/n{rnd_seed % 100000}_{i}"
            d = os.path.join(base, node)
            body = f"writer {wid} node {i} {token(node)} " + "x" * rnd.randrange(0, 3000)
            try:
                if rnd.random() < 0.15 and i > 1:
                    # delete an earlier node of this writer
                    j = rnd.randrange(1, i)
                    old = os.path.join(base, f"acme/users/w{wid}/memories/t/n{rnd_seed % 100000}_{j}")
                    if os.path.isdir(old):
                        # Intent first: if the daemon dies during the delete, it
                        # may or may not have landed (it was not acknowledged).
                        log.write(f"U {os.path.relpath(old, base)}\n")
                        for f in os.listdir(old):
                            os.unlink(os.path.join(old, f))
                        os.rmdir(old)
                        log.write(f"D {os.path.relpath(old, base)}\n")
                    continue
                # Only the node dir: its parent exists only inside the mount, so
                # once the daemon is gone this fails instead of writing to the
                # plain directory under the mountpoint.
                os.mkdir(d)
                for name, data in (("content.md", body), (".relations.json", "[]"),
                                   (".abstract.md", f"n{i}"), (".overview.md", "o")):
                    with open(os.path.join(d, name), "w") as f:
                        f.write(data)
                fd = os.open(os.path.join(d, ".meta.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.write(fd, b'{"status":"ACTIVE"}')
                os.close(fd)  # acknowledged commit
                log.write(f"C {node} {len(body)} {hash(body) & 0xffffffff}\n")
            except OSError:
                return


def token(node):
    """A word only this node's content holds: n123_45 -> z123q45."""
    a, b = node.rsplit("/", 1)[1][1:].split("_")
    return f"z{a}q{b}"


def search_consistent(mnt, expect, rnd, r):
    """After `.ctxfs/sync`: sampled present nodes are found by their word,
    deleted ones are never returned. Returns the number of disagreements."""
    base = os.path.join(mnt, "accounts")
    with open(os.path.join(mnt, ".ctxfs/sync")) as f:
        f.read()
    present = [n for n, w in expect.items() if w is not None]
    deleted = [n for n, w in expect.items() if w is None]
    bad = 0
    for node in rnd.sample(present, min(20, len(present))) + rnd.sample(deleted, min(20, len(deleted))):
        q = os.path.join(base, "acme", ".search", f"{token(node)}?mode=lexical&k=5")
        with open(q) as f:
            paths = [line.split("\t")[2] for line in f.read().splitlines() if line.strip()]
        found = f"accounts/{node}" in paths
        if found != (expect[node] is not None):
            print(f"  round {r}: search {'misses' if not found else 'returns deleted'} {node}")
            bad += 1
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--work", default="/var/tmp/ctxfs-torture")
    a = ap.parse_args()
    os.environ["PYTHONHASHSEED"] = "0"
    rnd = random.Random(a.seed)
    shutil.rmtree(a.work, ignore_errors=True)
    mnt, data = os.path.join(a.work, "mnt"), os.path.join(a.work, "data")
    os.makedirs(mnt)
    logs = [os.path.join(a.work, f"w{k}.log") for k in range(a.writers)]
    expect = {}  # node -> (len, hash) of the last acknowledged commit; None if deleted
    uncertain = set()  # deletes started but not acknowledged
    lost = 0
    total = 0
    print(f"crash torture: {a.rounds} rounds, {a.writers} writers, seed {a.seed}")
    for r in range(a.rounds):
        subprocess.run([BIN, "mount", mnt, "--data", data, "--repair-grace", "0"], check=True,
                       stdout=subprocess.DEVNULL)
        base = os.path.join(mnt, "accounts")
        # Verify everything acknowledged so far survived the previous kill.
        for node, want in expect.items():
            p = os.path.join(base, node, "content.md")
            if want is None:
                if os.path.exists(os.path.join(base, node)):
                    # A delete acknowledged and then the node back: a loss of the delete.
                    print(f"  round {r}: deleted node {node} is back")
                    lost += 1
                continue
            try:
                with open(p) as f:
                    body = f.read()
                if (len(body), hash(body) & 0xffffffff) != want:
                    print(f"  round {r}: {node} has other content")
                    lost += 1
            except OSError as e:
                print(f"  round {r}: acknowledged commit {node} lost ({e})")
                lost += 1
        lost += search_consistent(mnt, expect, rnd, r)
        for lp in logs:
            open(lp, "w").close()
        for k in range(a.writers):
            os.makedirs(os.path.join(base, f"acme/users/w{k}/memories/t"), exist_ok=True)
        stop_at = time.time() + 30
        procs = [mp.Process(target=writer, args=(base, k, a.seed * 100 + r * 10 + k, logs[k], stop_at))
                 for k in range(a.writers)]
        for p in procs:
            p.start()
        time.sleep(rnd.uniform(0.3, 2.5))
        with open(os.path.join(mnt, ".ctxfs/pid")) as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.join()
        while True:
            try:
                os.kill(pid, 0)
                time.sleep(0.02)
            except ProcessLookupError:
                break
        # No cleanup here: `ctxfs mount` must cope with whatever a SIGKILL
        # leaves at the mountpoint (auto-unmounted, or a dead mount).
        n = 0
        for lp in logs:
            with open(lp) as f:
                for line in f:
                    parts = line.split()
                    if parts[0] == "C":
                        expect[parts[1]] = (int(parts[2]), int(parts[3]))
                        n += 1
                    elif parts[0] == "U":
                        uncertain.add(parts[1])
                    else:
                        uncertain.discard(parts[1])
                        expect[parts[1]] = None
        # Deletes in flight at the kill: either outcome is correct.
        for node in uncertain:
            expect.pop(node, None)
        uncertain.clear()
        total += n
        fsck = subprocess.run([BIN, "fsck", "--data", data], capture_output=True, text=True)
        if fsck.returncode != 0:
            print(f"  round {r}: fsck found violations:\n{fsck.stdout}")
            lost += 1
        print(f"  round {r}: killed after {n} acknowledged commits; fsck {'clean' if fsck.returncode == 0 else 'DIRTY'}")
    # Final check after the last kill.
    subprocess.run([BIN, "mount", mnt, "--data", data], check=True, stdout=subprocess.DEVNULL)
    base = os.path.join(mnt, "accounts")
    for node, want in expect.items():
        exists = os.path.exists(os.path.join(base, node, "content.md"))
        if (want is None) == exists:
            print(f"  final: {node} {'lost' if want else 'not deleted'}")
            lost += 1
    lost += search_consistent(mnt, expect, rnd, "final")
    status = subprocess.run(["cat", os.path.join(mnt, ".ctxfs/status")], capture_output=True, text=True).stdout
    subprocess.run([BIN, "umount", mnt], stdout=subprocess.DEVNULL)
    print(f"rounds survived: {a.rounds}, acknowledged commits: {total}, commits lost: {lost}")
    print("status after the last remount:", " ".join(status.split())[:200])
    shutil.rmtree(a.work, ignore_errors=True)
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
