#!/usr/bin/env python3
"""Load run: 32 reader processes (cat, grep -r, search) and 4 writers (four-step
commits) against one mount for --seconds (default 300). Reports p50/p99 per
operation, every error by errno, and the daemon's open files and RSS at the
start and the end (leaks and growth). Exit status 1 on an undocumented error,
or when handles or memory keep growing.

    python3 scripts/load.py --bin target/release/ctxfs --seconds 300

Readers run as a reader uid of the account (they see committed versions
only), writers as its writer uid, as agents would.
"""
import argparse
import errno
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time

# Errors that are documented answers under this load (none: writers only
# replace nodes, nothing is deleted, no quota is set).
DOCUMENTED = set()


def four_steps(node, text, i):
    os.makedirs(node, exist_ok=True)
    with open(f"{node}/content.md", "w") as f:
        f.write(text)
    with open(f"{node}/.relations.json", "w") as f:
        f.write("[]\n")
    with open(f"{node}/.abstract.md", "w") as f:
        f.write(text[:80] + "\n")
    with open(f"{node}/.overview.md", "w") as f:
        f.write("# overview\n" + text[:200] + "\n")
    with open(f"{node}/.meta.json", "w") as f:
        f.write(json.dumps({"status": "ACTIVE", "i": i}))


WORDS = ("tea coffee deploy kubernetes postgres latency budget review alice bob "
         "incident outage retry cache index vector search memory agent skill").split()


def text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160))) + "\n"


READER, WRITER = 1002, 1001
CONFIG = f"""
[[account]]
id = "load"
writers = [{WRITER}]
readers = [{READER}]
"""


def become(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def reader(mnt, users, deadline, q, seed):
    become(READER)
    rng = random.Random(seed)
    lat, errs = {}, {}
    base = f"{mnt}/accounts/load/users"
    while time.time() < deadline:
        u = rng.choice(users)
        kind = rng.choices(["cat", "grep", "search", "ls"], [6, 1, 2, 1])[0]
        t = time.perf_counter()
        try:
            if kind == "cat":
                n = rng.randrange(100)
                with open(f"{base}/{u}/memories/notes/n{n}/content.md", "rb") as f:
                    f.read()
            elif kind == "ls":
                os.listdir(f"{base}/{u}/memories/notes")
            elif kind == "grep":
                r = subprocess.run(["grep", "-rl", rng.choice(WORDS), f"{base}/{u}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                if r.returncode > 1:
                    raise OSError(errno.EIO, r.stderr.decode()[:200])
            else:
                qtext = " ".join(rng.choice(WORDS) for _ in range(3))
                with open(f"{base}/{u}/.search/{qtext}", "rb") as f:
                    f.read()
        except OSError as e:
            key = f"{kind}:{errno.errorcode.get(e.errno, e.errno)}"
            errs[key] = errs.get(key, 0) + 1
            continue
        lat.setdefault(kind, []).append(time.perf_counter() - t)
    q.put((lat, errs))


def writer(mnt, user, deadline, q, seed):
    become(WRITER)
    rng = random.Random(seed)
    lat, errs = {}, {}
    i = 0
    while time.time() < deadline:
        n = rng.randrange(100)
        node = f"{mnt}/accounts/load/users/{user}/memories/notes/n{n}"
        t = time.perf_counter()
        try:
            four_steps(node, text(rng), i)
        except OSError as e:
            key = f"commit:{errno.errorcode.get(e.errno, e.errno)}"
            errs[key] = errs.get(key, 0) + 1
            continue
        lat.setdefault("commit", []).append(time.perf_counter() - t)
        i += 1
    q.put((lat, errs))


def daemon_state(pid):
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
    return fds, rss


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--readers", type=int, default=32)
    ap.add_argument("--writers", type=int, default=4)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ctxfs-load-", dir="/tmp")
    os.chmod(tmp, 0o755)
    mnt, data = f"{tmp}/mnt", f"{tmp}/data"
    os.makedirs(mnt)
    os.chmod(mnt, 0o755)
    with open(f"{tmp}/config.toml", "w") as f:
        f.write(CONFIG)
    subprocess.run([a.bin, "mount", mnt, "--data", data, "--embedder", "hash",
                    "--config", f"{tmp}/config.toml"], check=True)
    try:
        pid = int(open(f"{mnt}/.ctxfs/pid").read())
        users = [f"u{k}" for k in range(a.writers)]
        rng = random.Random(1)
        print(f"seeding {len(users) * 100} nodes ...", flush=True)
        for u in users:
            for n in range(100):
                four_steps(f"{mnt}/accounts/load/users/{u}/memories/notes/n{n}", text(rng), 0)
        open(f"{mnt}/.ctxfs/sync").read()
        start = daemon_state(pid)
        deadline = time.time() + a.seconds
        q = mp.Queue()
        procs = [mp.Process(target=reader, args=(mnt, users, deadline, q, s))
                 for s in range(a.readers)]
        procs += [mp.Process(target=writer, args=(mnt, users[k], deadline, q, 100 + k))
                  for k in range(a.writers)]
        for p in procs:
            p.start()
        samples = []
        while time.time() < deadline:
            time.sleep(min(30, max(0.1, deadline - time.time())))
            samples.append(daemon_state(pid))
            print(f"  t={a.seconds - max(0, int(deadline - time.time()))}s "
                  f"fds={samples[-1][0]} rss={samples[-1][1]} MiB", flush=True)
        lat, errs = {}, {}
        for _ in procs:
            l, e = q.get()
            for k, v in l.items():
                lat.setdefault(k, []).extend(v)
            for k, v in e.items():
                errs[k] = errs.get(k, 0) + v
        for p in procs:
            p.join()
        time.sleep(2)
        end = daemon_state(pid)
    finally:
        subprocess.run([a.bin, "umount", mnt])
    print(f"\n{a.readers} readers + {a.writers} writers, {a.seconds} s")
    print(f"{'op':8} {'count':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for k in sorted(lat):
        v = lat[k]
        print(f"{k:8} {len(v):8} {pct(v, 50):8.2f} {pct(v, 99):8.2f}")
    print(f"errors: {errs or 'none'}")
    mid = samples[len(samples) // 2] if samples else start
    print(f"daemon fds: start {start[0]}, middle {mid[0]}, end {end[0]}; "
          f"RSS MiB: start {start[1]}, middle {mid[1]}, end {end[1]}")
    bad = {k: v for k, v in errs.items() if k.split(":")[1] not in DOCUMENTED}
    leak = end[0] > start[0] + 8
    # Memory may grow with the data (new versions, redb's bounded cache), not
    # without bound: the second half must grow less than 1.5x the first.
    growth = (end[1] - mid[1]) > 1.5 * max(mid[1] - start[1], 20)
    if bad or leak or growth:
        print(f"FAIL: undocumented errors {bad}, fd leak {leak}, memory growth {growth}")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
