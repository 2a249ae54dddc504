#!/usr/bin/env python3
"""ctxfs benchmarks, each printed as a ratio against a baseline measured in the
same run on a plain local directory on the same disk.

  tree   N ACTIVE nodes (5 files, ~1 KB content): find, grep -r, cat every
         .abstract.md (found by find, and by path); warm cache and right after
         mount (local: caches dropped), on the main mount and on root's view
         (`--views`); the per-file floor: open+close of one cached file, one
         isatty, and the FUSE requests an open+close costs (daemon metrics)
  commit four-step durable commits, 1 and 8 writers (local: one fsync per node)
  batch  nodes committed by one write to accounts/A/.ctxfs/batch, one writer,
         against the same local fsync-per-node rate
  ifversion  four-step commits with "if_version" in .meta.json against the
         same commits without it (the baseline is ctxfs itself here)
  big    M nodes in one category: create / lookup / listing cost per entry at
         1k, 10k, ... M; mount time and daemon RSS after a full find

  members  the tree workloads read by an account's writer with and without
         users' own uids in the account (each users/{u} entry then looked
         up on every walk); the account without them is the baseline

Usage: scripts/bench.py [--nodes N] [--big M] [--only tree,commit,batch,ifversion,big,members] [--model-dir DIR]
"""
import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import wait_sync  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("CTXFS_BIN", os.path.join(ROOT, "target", "release", "ctxfs"))
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def content(i):
    """~1 KB; one node in 100 holds the word `grep -r` looks for."""
    rnd = random.Random(i)
    body = " ".join(rnd.choice(WORDS) for _ in range(170))
    needle = "needle " if i % 100 == 0 else ""
    return f"# note {i}\n{needle}{body}"[:1023] + "\n"


def node_rel(i, per_cat=100):
    return f"acme/users/u{i % 10}/memories/c{(i // 10) % max(1, per_cat)}/n{i}"


def write_node(base, rel, i, durable_local, meta=b'{"status":"ACTIVE"}\n'):
    n = os.path.join(base, rel)
    os.makedirs(n, exist_ok=True)
    files = [("content.md", content(i)), (".relations.json", "[]\n"),
             (".abstract.md", f"abstract {i}\n"), (".overview.md", f"# overview {i}\n")]
    for name, data in files:
        with open(os.path.join(n, name), "w") as f:
            f.write(data)
    fd = os.open(os.path.join(n, ".meta.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, meta)
    if durable_local:
        os.fsync(fd)  # the local baseline's one fsync per node
    os.close(fd)      # on ctxfs: the commit point, durable when close returns


def _writer(args):
    base, ids, durable_local, rel_fn = args
    for i in ids:
        write_node(base, rel_fn(i), i, durable_local)
    return len(ids)


def rel_flat(i):
    return f"acme/agents/bot/memories/events/e{i:07d}"


def populate(base, ids, writers, durable_local, rel_fn=node_rel):
    chunks = [ids[k::writers] for k in range(writers)]
    t = time.perf_counter()
    if writers == 1:
        _writer((base, ids, durable_local, rel_fn))
    else:
        with mp.Pool(writers) as p:
            p.map(_writer, [(base, c, durable_local, rel_fn) for c in chunks])
    return time.perf_counter() - t


MODEL_DIR = None  # --model-dir: mount with MiniLM instead of the hashing fallback


class Ctxfs:
    def __init__(self, work, config=None, views=False):
        self.mnt = os.path.join(work, "mnt")
        self.data = os.path.join(work, "data")
        # --views: each uid's read-only view at VIEWS/UID (root's here).
        self.views = os.path.join(work, "views") if views else None
        os.makedirs(self.mnt, exist_ok=True)
        self.config = None
        if config is not None:
            self.config = os.path.join(work, "config.toml")
            with open(self.config, "w") as f:
                f.write(config)

    def mount(self):
        t = time.perf_counter()
        extra = ["--model-dir", MODEL_DIR] if MODEL_DIR else []
        if self.config:
            extra += ["--config", self.config]
        if self.views:
            extra += ["--views", self.views]
        subprocess.run([BIN, "mount", self.mnt, "--data", self.data,
                        "--threads", os.environ.get("CTXFS_THREADS", "16")] + extra, check=True,
                       stdout=subprocess.DEVNULL)
        return time.perf_counter() - t

    def umount(self):
        subprocess.run([BIN, "umount", self.mnt], check=True, stdout=subprocess.DEVNULL)

    def pid(self):
        with open(os.path.join(self.mnt, ".ctxfs/pid")) as f:
            return int(f.read())

    def rss_mb(self):
        with open(f"/proc/{self.pid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def base(self):
        return os.path.join(self.mnt, "accounts")

    def view_base(self, uid=0):
        return os.path.join(self.views, str(uid), "accounts")

    def requests(self):
        """Every FUSE request the daemon has counted, main mount and views."""
        with open(os.path.join(self.mnt, ".ctxfs/metrics")) as f:
            return sum(float(line.split()[-1]) for line in f
                       if line.startswith("ctxfs_requests_total{"))


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        print(f"  (cannot drop caches: {e})")


def timed(cmd, reps=3):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


TREE_OPS = {
    "find": "find {d} | wc -l",
    "grep -r": "grep -r needle {d} | wc -l",  # 100 matches per 10,000 nodes
    "cat .abstract.md": "find {d} -name .abstract.md -exec cat {{}} + | wc -l",
}


def report(rows, title):
    print(f"\n{title}")
    print(f"  {'workload':34} {'local':>10} {'ctxfs':>10} {'ratio':>8}")
    for name, local, fs, unit in rows:
        if unit == "s":
            print(f"  {name:34} {local:9.3f}s {fs:9.3f}s {fs / local:7.2f}x")
        elif unit == "us":
            print(f"  {name:34} {local:8.2f}us {fs:8.2f}us {fs / local:7.1f}x")
        else:
            print(f"  {name:34} {local:8.0f}/s {fs:8.0f}/s {fs / local:7.2f}x")


def per_call_us(path, calls=20000):
    """The floor under a tree walk: microseconds per open+close of one
    cached file (FUSE: an OPEN and a RELEASE), and per isatty on an open
    file (FUSE: one IOCTL round trip, the cheapest request there is)."""
    t = time.perf_counter()
    for _ in range(calls):
        os.close(os.open(path, os.O_RDONLY))
    opened = (time.perf_counter() - t) / calls * 1e6
    fd = os.open(path, os.O_RDONLY)
    t = time.perf_counter()
    for _ in range(calls):
        os.isatty(fd)
    tty = (time.perf_counter() - t) / calls * 1e6
    os.close(fd)
    return opened, tty


def round_trips(fs, path, calls=2000):
    """FUSE requests the daemon counts per open+close of `path` (warm), less
    what reading the counter itself costs (measured the same way)."""
    os.close(os.open(path, os.O_RDONLY))
    r0 = fs.requests()
    r1 = fs.requests()
    for _ in range(calls):
        os.close(os.open(path, os.O_RDONLY))
    r2 = fs.requests()
    # RELEASE is sent asynchronously: give it time to be counted.
    time.sleep(0.5)
    r2 = max(r2, fs.requests() - (r1 - r0))
    return max(0.0, (r2 - r1) - (r1 - r0)) / calls


def bench_tree(work, n):
    local = os.path.join(work, "local")
    fs = Ctxfs(work, views=True)
    fs.mount()
    ids = list(range(n))
    tl = populate(local, ids, 8, False)
    tf = populate(fs.base(), ids, 8, False)
    print(f"  populated {n} nodes: local {tl:.1f}s, ctxfs {tf:.1f}s")
    # The warm rows measure reads, not reads beside the indexer's catching up.
    t = time.perf_counter()
    wait_sync(fs.mnt)
    print(f"  index caught up {time.perf_counter() - t:.1f}s after the last commit")
    ops = dict(TREE_OPS)
    # By path: every walk from the top, as `cat PATH` of an agent does.
    ops["cat .abstract.md by path"] = "cd {d} && cat */users/*/memories/*/*/.abstract.md | wc -l"
    rows = []
    for name, cmd in ops.items():
        for d in (local, fs.base(), fs.view_base()):
            timed(cmd.format(d=d), 1)
        lo = timed(cmd.format(d=local))
        rows.append((f"{name} (warm)", lo, timed(cmd.format(d=fs.base())), "s"))
        rows.append((f"{name} (warm, view)", lo, timed(cmd.format(d=fs.view_base())), "s"))
    f = os.path.join(node_rel(0), ".abstract.md")
    lo, lt = per_call_us(os.path.join(local, f))
    fo, ft = per_call_us(os.path.join(fs.base(), f))
    vo, _ = per_call_us(os.path.join(fs.view_base(), f))
    rows.append(("open+close one file, us per call", lo, fo, "us"))
    rows.append(("open+close one file, view, us", lo, vo, "us"))
    rows.append(("isatty (one round trip), us per call", lt, ft, "us"))
    trips_main = round_trips(fs, os.path.join(fs.base(), f))
    trips_view = round_trips(fs, os.path.join(fs.view_base(), f))
    for name, cmd in ops.items():
        drop_caches()
        tl = timed(cmd.format(d=local), 1)
        cold = []
        for d in (fs.base, fs.view_base):
            fs.umount()
            drop_caches()
            fs.mount()
            cold.append(timed(cmd.format(d=d()), 1))
        rows.append((f"{name} (after mount / cold)", tl, cold[0], "s"))
        rows.append((f"{name} (after mount, view)", tl, cold[1], "s"))
    report(rows, f"tree: {n} ACTIVE nodes, 5 files each; 'view' rows: root's view (--views)")
    print(f"  FUSE requests per open+close of a cached file: main mount {trips_main:.2f}, view {trips_view:.2f}")
    fs.umount()


MEMBERS_PLAIN = '[[account]]\nid = "acme"\nwriters = [1001]\n'
MEMBERS_SCOPED = MEMBERS_PLAIN + '[[account.user]]\nid = "u0"\nuids = [1201]\n'


def bench_members(work, n, rounds=3):
    """What users' own uids cost: the same tree (users u0..u9) in an account
    without them and in one where user u0 has a uid, so each users/{u}
    entry is looked up on every walk. Both read by the account's writer
    (uid 1001); alternating rounds, medians."""
    mounts = {}
    for name, cfg in (("plain", MEMBERS_PLAIN), ("users' uids", MEMBERS_SCOPED)):
        fs = Ctxfs(os.path.join(work, name.split("'")[0]), cfg)
        fs.mount()
        populate(fs.base(), list(range(n)), 8, False)
        wait_sync(fs.mnt)
        mounts[name] = fs
    as_writer = "setpriv --reuid 1001 --regid 1001 --clear-groups sh -c '{}'"
    ops = dict(TREE_OPS)
    ops["cat .abstract.md by path"] = "cd {d} && cat acme/users/u*/memories/c*/n*/.abstract.md | wc -l"
    times = {k: {m: [] for m in mounts} for k in ops}
    for r in range(rounds + 1):
        order = list(mounts) if r % 2 == 0 else list(reversed(mounts))
        for name, cmd in ops.items():
            for m in order:
                t = timed(as_writer.format(cmd.format(d=mounts[m].base())), 1)
                if r > 0:  # the first round warms the caches
                    times[name][m].append(t)
    rows = [(f"{k} (warm)", statistics.median(v["plain"]), statistics.median(v["users' uids"]), "s")
            for k, v in times.items()]
    print("  baseline column: the account without users' uids; ctxfs column: with them")
    report(rows, f"members: {n} nodes under users/u0..u9, read by the account's writer")
    for fs in mounts.values():
        fs.umount()


def bench_commit(work, n, rounds=5):
    """Local fsync latency on a shared disk is noisy: alternate local and
    ctxfs rounds and compare medians."""
    rows = []
    for writers in (1, 8):
        fs = Ctxfs(os.path.join(work, f"c{writers}"))
        fs.mount()
        rl, rf = [], []
        for r in range(rounds):
            ids = list(range(r * n, (r + 1) * n))
            rl.append(n / populate(os.path.join(work, f"clocal{writers}"), ids, writers, True))
            rf.append(n / populate(fs.base(), ids, writers, False))
        print(f"  {writers} writer(s): local {[round(x) for x in rl]}, ctxfs {[round(x) for x in rf]}")
        rows.append((f"commits/s, {writers} writer(s), median", statistics.median(rl), statistics.median(rf), "rate"))
        fs.umount()
    report(rows, f"commit: {rounds} rounds of {n} four-step commits, each durable")


def bench_if_version(work, n, rounds=5):
    """The same four-step commits with and without `"if_version"` in
    `.meta.json` (new nodes: 0), alternating rounds on one mount, then a
    second version of each node over the version read: the condition's
    cost is one comparison under the node's lock."""
    fs = Ctxfs(os.path.join(work, "v"))
    fs.mount()
    plain, cond, again = [], [], []
    for r in range(rounds):
        for out, meta, tag in ((plain, b'{"status":"ACTIVE"}\n', "p"),
                               (cond, b'{"status":"ACTIVE","if_version":0}\n', "v")):
            t = time.perf_counter()
            for i in range(r * n, (r + 1) * n):
                write_node(fs.base(), f"acme/users/{tag}/memories/c{r}/n{i}", i, False, meta)
            out.append(n / (time.perf_counter() - t))
        t = time.perf_counter()
        for i in range(r * n, (r + 1) * n):
            write_node(fs.base(), f"acme/users/v/memories/c{r}/n{i}", i + 1, False,
                       b'{"status":"ACTIVE","if_version":1}\n')
        again.append(n / (time.perf_counter() - t))
    print(f"  plain {[round(x) for x in plain]}, if_version 0 {[round(x) for x in cond]}, "
          f"if_version 1 (second versions) {[round(x) for x in again]}")
    report([(f"commits/s, new nodes, if_version 0 against none, median", statistics.median(plain),
             statistics.median(cond), "rate")],
           f"if_version: {rounds} rounds of {n} four-step commits with and without the condition")
    fs.umount()


def bench_batch(work, n, rounds=5):
    """One writer: N nodes as one batch file (one close, one transaction)
    against N local four-file nodes with one fsync each, alternating."""
    fs = Ctxfs(os.path.join(work, "b"))
    fs.mount()
    os.makedirs(os.path.join(fs.base(), "acme"), exist_ok=True)
    rl, rf = [], []
    for r in range(rounds):
        ids = list(range(r * n, (r + 1) * n))
        rl.append(n / populate(os.path.join(work, "blocal"), ids, 1, True))
        lines = "".join(
            json.dumps({"node": node_rel(i).split("/", 1)[1], "content": content(i),
                        "abstract": f"abstract {i}", "overview": f"# overview {i}",
                        "relations": [], "meta": {"status": "ACTIVE"}}) + "\n"
            for i in ids)
        t = time.perf_counter()
        with open(os.path.join(fs.base(), "acme/.ctxfs/batch"), "w") as f:
            f.write(lines)
        rf.append(n / (time.perf_counter() - t))
    print(f"  local {[round(x) for x in rl]}, ctxfs batch {[round(x) for x in rf]}")
    report([(f"nodes/s, batches of {n}, 1 writer, median", statistics.median(rl),
             statistics.median(rf), "rate")],
           f"batch: {rounds} rounds of {n} nodes in one durable batch (local: one fsync per node)")
    fs.umount()


def bench_big(work, total):
    fs = Ctxfs(os.path.join(work, "big"))
    local = os.path.join(work, "biglocal")
    fs.mount()
    marks = [m for m in (1000, 10000, 100000, 1000000) if m <= total]
    done = 0
    rows = []
    cat_l = os.path.join(local, "acme/agents/bot/memories/events")
    cat_f = os.path.join(fs.base(), "acme/agents/bot/memories/events")
    for m in marks:
        batch = list(range(done, m))
        # the cost of the last 1000 creates before the mark
        head, tail = batch[:-1000], batch[-1000:]
        if head:
            populate(local, head, 8, False, rel_flat)
            populate(fs.base(), head, 8, False, rel_flat)
        tl = populate(local, tail, 8, False, rel_flat)
        tf = populate(fs.base(), tail, 8, False, rel_flat)
        rows.append((f"create/s at {m} entries", len(tail) / tl, len(tail) / tf, "rate"))
        sample = [rel_flat(random.randrange(m)) for _ in range(2000)]
        def stat_all(base):
            t = time.perf_counter()
            for r in sample:
                os.stat(os.path.join(base, r, "content.md"))
            return len(sample) / (time.perf_counter() - t)
        rows.append((f"lookup/s at {m} entries", stat_all(local), stat_all(fs.base()), "rate"))
        def ls(d):
            t = time.perf_counter()
            k = len(os.listdir(d))
            return k / (time.perf_counter() - t)
        rows.append((f"listing entries/s at {m} entries", ls(cat_l), ls(cat_f), "rate"))
        done = m
    report(rows, f"big: up to {total} nodes in one category")
    fs.umount()
    t = fs.mount()
    print(f"\n  mount ready with {total} nodes stored: {t * 1000:.0f} ms (target < 1000 ms)")
    t0 = time.perf_counter()
    subprocess.run(f"find {fs.base()} | wc -l", shell=True, check=True, stdout=subprocess.DEVNULL)
    print(f"  full find: {time.perf_counter() - t0:.1f}s; daemon RSS after it: {fs.rss_mb():.0f} MB (target < 300 MB)")
    fs.umount()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--commits", type=int, default=500)
    ap.add_argument("--big", type=int, default=100000)
    ap.add_argument("--only", default="tree,commit,batch,ifversion,big")
    ap.add_argument("--work", default=os.environ.get("BENCH_DIR", "/var/tmp/ctxfs-bench"))
    ap.add_argument("--model-dir", default=None,
                    help="mount with MiniLM from this directory (default: the hashing fallback)")
    a = ap.parse_args()
    global MODEL_DIR
    MODEL_DIR = os.path.abspath(a.model_dir) if a.model_dir else None
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} missing: run `cargo build --release` (make bench does)")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    print(f"ctxfs bench: work dir {a.work} (local baseline on the same disk)")
    only = a.only.split(",")
    try:
        if "tree" in only:
            bench_tree(os.path.join(a.work, "tree"), a.nodes)
        if "commit" in only:
            bench_commit(os.path.join(a.work, "commit"), a.commits)
        if "batch" in only:
            bench_batch(os.path.join(a.work, "batch"), a.commits)
        if "ifversion" in only:
            bench_if_version(os.path.join(a.work, "ifversion"), a.commits)
        if "big" in only:
            bench_big(os.path.join(a.work, "big"), a.big)
        if "members" in only:
            bench_members(os.path.join(a.work, "members"), a.nodes)
    finally:
        subprocess.run(f"for m in $(grep {a.work} /proc/mounts | cut -d' ' -f2); do {BIN} umount $m || umount -l $m; done",
                       shell=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
