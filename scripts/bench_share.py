#!/usr/bin/env python3
"""Shares of the loaded-index bound: one tenant's searches of its large
account, alone and while another tenant (another uid) loads index after
index, in one run on one mount (release binary, hashing embedder).

    python3 scripts/bench_share.py [--bin target/release/ctxfs]
        [--victim-nodes 15000] [--big-accounts 12] [--big-nodes 6000]
        [--empty-accounts 260] [--max-loaded-mb 384] [--seconds 30]

The victim (uid 2001) searches its account every 0.7 s (as the attack that
found the defect did). The attacker (uid
2002) searches, as fast as it can, (1) 260 empty accounts of its own,
which pushes the count of loaded indexes past 256, then (2) its 12 large
accounts, which push their bytes past `[index] max_loaded_mb`; and, as the
floor, one account of its own at the same rate (no loads: what sharing two
cores costs). Prints the victim's search p50/p99 alone and under each, with
the ratios; the figures go to docs/BENCHMARKS.md with this command.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

VICTIM, ATTACKER = 2001, 2002


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def batch(mnt, account, prefix, n, words):
    """`n` nodes into `account` through `.ctxfs/batch` (as root), 5,000 a write."""
    for start in range(0, n, 5000):
        lines = "".join(json.dumps({
            "node": f"users/u/memories/{prefix}{i // 1000}/n{i}",
            "content": f"{words} note {i}: " + " ".join(
                f"w{(i * 7 + k) % 997}" for k in range(12)),
            "abstract": f"{words} note {i}",
            "meta": {"status": "ACTIVE"}}) + "\n" for i in range(start, min(n, start + 5000)))
        with open(os.path.join(mnt, f"accounts/{account}/.ctxfs/batch"), "w") as f:
            f.write(lines)


def searcher(uid, paths, seconds, every, out):
    """A child process of `uid`: searches `paths` in turn for `seconds`
    (one every `every` s, or as fast as it can with 0), latencies to `out`."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        lat, i = [], 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            p = paths[i % len(paths)]
            i += 1
            t = time.perf_counter()
            with open(p, "rb") as f:
                f.read()
            lat.append((time.perf_counter() - t) * 1000)
            if every:
                time.sleep(max(0.0, every - (time.perf_counter() - t)))
        with open(out, "w") as f:
            json.dump(lat, f)
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 - a child reports and exits
        print(f"searcher {uid}: {e}", file=sys.stderr)
        os._exit(1)


def run(mnt, victim_q, attack_paths, seconds, tmp, tag, every=0.2):
    vout, aout = os.path.join(tmp, f"v-{tag}.json"), os.path.join(tmp, f"a-{tag}.json")
    for out in (vout, aout):
        open(out, "w").close()
        os.chmod(out, 0o666)
    pids = [searcher(VICTIM, [victim_q], seconds, every, vout)]
    if attack_paths:
        pids.append(searcher(ATTACKER, attack_paths, seconds, 0, aout))
    for p in pids:
        _, st = os.waitpid(p, 0)
        if st != 0:
            raise SystemExit(f"a searcher failed ({tag})")
    v = json.load(open(vout))
    a = json.load(open(aout)) if attack_paths else []
    return v, a


def status(mnt):
    return json.loads(open(os.path.join(mnt, ".ctxfs/status")).read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ctxfs")
    ap.add_argument("--victim-nodes", type=int, default=15000)
    ap.add_argument("--big-accounts", type=int, default=12)
    ap.add_argument("--big-nodes", type=int, default=6000)
    ap.add_argument("--empty-accounts", type=int, default=260)
    ap.add_argument("--max-loaded-mb", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--every", type=float, default=0.7,
                    help="the victim's search interval, seconds (the attack found: 0.7)")
    ap.add_argument("--phases", default="alone,floor,empty,large",
                    help="which to run (comma-separated)")
    a = ap.parse_args()
    binary = os.path.abspath(a.bin)
    tmp = tempfile.mkdtemp(prefix="ctxfs-share-", dir="/tmp")
    os.chmod(tmp, 0o755)
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cfg = [f'[[account]]\nid = "victim"\nwriters = [{VICTIM}]\n']
    empties = [f"e{i}" for i in range(a.empty_accounts)]
    bigs = [f"big{i}" for i in range(a.big_accounts)]
    for acc in empties + bigs:
        cfg.append(f'[[account]]\nid = "{acc}"\nwriters = [{ATTACKER}]\n')
    cfg.append(f"[index]\nmax_loaded_mb = {a.max_loaded_mb}\n")
    cfg_path = os.path.join(tmp, "config.toml")
    open(cfg_path, "w").write("\n".join(cfg))
    subprocess.run([binary, "mount", mnt, "--data", data, "--config", cfg_path,
                    "--embedder", "hash"], check=True, capture_output=True)
    try:
        t = time.perf_counter()
        batch(mnt, "victim", "c", a.victim_nodes, "victim")
        for acc in bigs:
            batch(mnt, acc, "c", a.big_nodes, acc)
        open(os.path.join(mnt, ".ctxfs/sync")).read()
        print(f"setup: {a.victim_nodes} + {a.big_accounts} x {a.big_nodes} nodes indexed in "
              f"{time.perf_counter() - t:.0f} s; bound {a.max_loaded_mb} MB, 256 accounts",
              flush=True)
        q = lambda acc, words: os.path.join(mnt, f"accounts/{acc}/.search/{words}")  # noqa: E731
        victim_q = q("victim", "victim note w17 w24")
        # Warm: the victim's index loaded by its own search.
        run(mnt, victim_q, [], 2, tmp, "warm")
        phases = [
            ("alone", "alone", []),
            # The floor: the same search rate on one account of the
            # attacker's, loaded once (the cost of sharing 2 cores).
            ("floor", "beside 1 large account searched (floor)",
             [q(bigs[0], f"{bigs[0]} note w5")]),
            ("empty", f"beside {a.empty_accounts} empty accounts searched",
             [q(e, "anything") for e in empties]),
            ("large", f"beside {a.big_accounts} large accounts searched",
             [q(b, f"{b} note w5") for b in bigs]),
        ]
        wanted = a.phases.split(",")
        rows = []
        for key, name, paths in phases:
            if key not in wanted:
                continue
            loads0 = status(mnt)["indexer"]["index_loads"]
            v, att = run(mnt, victim_q, paths, a.seconds, tmp, key, a.every)
            st = status(mnt)["indexer"]
            rows.append((name, v, att, st["index_loads"] - loads0, st["loaded_accounts"],
                         st["loaded_mb"]))
        base = rows[0][1]
        for name, v, att, loads, nacc, mb in rows:
            extra = ""
            if att:
                extra = (f"  attacker {len(att) / a.seconds:.0f} searches/s, "
                         f"p50 {pct(att, 50):.1f} ms")
            print(f"{name:40s} victim p50 {pct(v, 50):7.1f} ms  p99 {pct(v, 99):7.1f} ms "
                  f"({len(v)} searches; {pct(v, 50) / pct(base, 50):.2f}x / "
                  f"{pct(v, 99) / pct(base, 99):.2f}x of alone){extra}; "
                  f"{loads} loads, {nacc} loaded, {mb} MB", flush=True)
        print("held at the end:", json.dumps(status(mnt)["indexer"].get("loaded_by_tenant")))
    finally:
        subprocess.run([binary, "umount", mnt], capture_output=True)
        if os.environ.get("KEEP_LOG"):
            shutil.copy(os.path.join(data, "ctxfs.log"), "/tmp/share.log")
        if tmp.startswith("/tmp/ctxfs-share-"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
