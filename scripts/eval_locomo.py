#!/usr/bin/env python3
"""Memory from real conversations: the LoCoMo development split through the
inbox, then answers and evidence recall, by question category.

LoCoMo (Maharana et al., ACL 2024) holds long two-person chats over many
dated sessions with questions labelled by their evidence turns and a
category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,
5 adversarial: the conversation does not answer it). The data is not
shipped with the project (CC BY-NC): point --data (or LOCOMO_DIR) at the
directory holding `locomo-dev.json`.

Each conversation is fed as a platform would: every session, with its
date, through `users/U/inbox/sN.json` of each speaker's own copy (that
speaker's turns are role `user`, the other's `assistant`), in order, each
extraction finished and indexed before the next. A question is asked in
the copy of the speaker it names (speaker A's when it names both or
neither).

Rows, the same questions and the same answer prompt:
  none       no memory
  bm25       BM25 over the raw turns (computed here), top 10
  turns      ctxfs search over every turn as a plain node, top 10
  messages   ctxfs search over the stored conversations alone (the inbox), top 10
  mem+conv   ctxfs search over the user's directory: memories and messages, top 10
  packed     the same search within a budget (`?budget=600`, about the tokens
             the mem+conv row gives): the answer as ctxfs packs it, summary first
  whole      the whole history in the prompt, only where it fits the model
             (the row is scored over the questions where it fits)

A memory result is read as an agent reads it: `content.md` whole when it
holds at most 12 lines, else the lines its result names (LINES, as `sed -n`
would), so a memory grown over many sessions does not fill the prompt.

Evidence recall@10: one of the top 10 holds an evidence turn (a memory by
the provenance of the lines read: a quoted line by its words; in the
packed row, the lines its abstract, overview and matching lines show). Category 5 is scored 1 for "unknown" (its gold answer is
adversarial). Answers are cached by prompt (--cache).

    python3 scripts/eval_locomo.py --data DIR --sessions 3      # a quick run
    python3 scripts/eval_locomo.py --data DIR                   # all sessions
    python3 scripts/eval_locomo.py --data DIR --no-answers      # extraction and recall only
    python3 scripts/eval_locomo.py --data DIR --messages-only   # search over the messages, no model

`--messages-only` measures the search over the stored messages alone, in
minutes: the inbox's model is a closed port, so every extraction fails and
no memory is made, while every message is stored and indexed as always.
It reports evidence recall for BM25, every turn a node and the messages
alone, and answers with the rows among those asked for (`--rows
bm25,messages --sample 20`; `--no-answers` for recall alone; `--keep` and
`--reuse` work as above).

The whole split is 288 extractions (about 45 s each on a quiet 2-core
machine, 4 to 5 hours; far more beside other work) and
about 1,000 questions. A run can span several sittings: `--keep` keeps its
directory, with a copy of the binary that started it (`ctxfs` there);
`--resume DIR` mounts it again with that binary, feeds only the sessions
not yet fed (waiting for one left in flight), and reports over all of them
(each extraction's figures are kept in `DIR/extractions.jsonl`). The
answers of the whole split would be some 15 hours more: `--sample N` asks
the model a fixed random sample of N questions per category (seeded), and
evidence recall stays over every question.
"""
import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_inbox import bm25_rank, provenance, wait_status  # noqa: E402
from eval_qa import Model, f1, node_body, search  # noqa: E402
from mountutil import mount_with_llm, query_name, wait_sync  # noqa: E402

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ROWS = ["none", "bm25", "turns", "messages", "mem+conv", "packed", "whole"]
# The budget of the packed row, in ctxfs's estimated tokens (SEMANTICS, "Tokens"): about the
# size of the mem+conv row's context.
PACKED_BUDGET = 600
MSG = re.compile(r"/inbox/s(\d+)\.json#(\d+)$")
# The whole history is offered only below this many estimated tokens
# (characters / 4): the model's context is 8,192 with the prompt and answer.
WHOLE_MAX_TOKENS = 7000
# Results read to find a user's top 10 messages among their memories.
MESSAGES_K = 300
MONTHS = {m: i for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july", "august",
                                      "september", "october", "november", "december"], 1)}


def session_time(s):
    """'1:10 pm on 27 March, 2023' -> datetime (UTC)."""
    m = re.match(r"\s*(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+(\w+),?\s+(\d{4})", s, re.I)
    if not m:
        raise ValueError(f"unreadable session date {s!r}")
    h = int(m[1]) % 12 + (12 if m[3].lower() == "pm" else 0)
    return dt.datetime(int(m[6]), MONTHS[m[5].lower()], int(m[4]), h, int(m[2]), tzinfo=dt.timezone.utc)


def sessions_of(conv, limit):
    """[(n, datetime, [(speaker, text), ...])] in session order."""
    out = []
    n = 1
    while f"session_{n}" in conv and (limit is None or n <= limit):
        turns = []
        for t in conv[f"session_{n}"]:
            text = t["text"]
            if t.get("blip_caption"):
                # A shared photo, as the dataset describes it in words.
                text = f"{text} [shares a photo: {t['blip_caption']}]"
            turns.append((t["speaker"], text))
        out.append((n, session_time(conv[f"session_{n}_date_time"]), turns))
        n += 1
    return out


def evidence(q):
    """{(session, turn index from 0)} of a question's evidence."""
    out = set()
    for e in q.get("evidence", []):
        for s, t in re.findall(r"D(\d+):(\d+)", e):
            out.add((int(s), int(t) - 1))
    return out


def turn_line(day, who, text):
    return f"[{day.date().isoformat()}] {who}: {text}"


def copy_for(question, a, b):
    """The speaker whose copy answers: the one the question names."""
    words = set(re.findall(r"[A-Za-z]+", question))
    return b if b in words and a not in words else a


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bin", default=os.environ.get("CTXFS_BIN", "target/release/ctxfs"))
    ap.add_argument("--model-dir", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--data", default=os.environ.get("LOCOMO_DIR", os.path.join(here, "..", "datasets", "locomo-dev")))
    ap.add_argument("--sessions", type=int, default=None, help="the first N sessions of each conversation")
    ap.add_argument("--conversations", type=int, default=None, help="the first N conversations")
    ap.add_argument("--llm-url", default=None)
    ap.add_argument("--cache", default="/var/tmp/ctxfs-llm/qa-answers.json")
    ap.add_argument("--rows", default=",".join(ROWS), help="answer rows to run (comma-separated)")
    ap.add_argument("--no-answers", action="store_true", help="extraction and evidence recall only")
    ap.add_argument("--audit", help="write every memory with its cited messages here (JSON lines)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--memories", choices=["quoted", "written"],
                    help="[llm] memories of the mount (the daemon's default when not given)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (its path is printed)")
    ap.add_argument("--reuse", help="a directory kept by --keep: search and answer again without extracting")
    ap.add_argument("--resume", help="a directory kept by --keep: feed the sessions not yet fed, with its binary")
    ap.add_argument("--reindex", action="store_true",
                    help="with --reuse: rebuild the kept data's index with --bin first (a newer build's labels)")
    ap.add_argument("--messages-only", action="store_true",
                    help="no extraction: feed the messages (every extraction fails), rows bm25/turns/messages")
    ap.add_argument("--sample", type=int, default=None,
                    help="answer a fixed random sample of N questions per category (recall: all)")
    ap.add_argument("--sample-seeds", default="2026",
                    help="with --sample: the seeds of the samples drawn (comma-separated; their union is asked)")
    ap.add_argument("--categories", default="1,2,3,4,5",
                    help="answer only questions of these categories (comma-separated; recall: all)")
    args = ap.parse_args()
    path = os.path.join(args.data, "locomo-dev.json")
    if not os.path.exists(path):
        sys.exit(f"LoCoMo not found: {path} (set LOCOMO_DIR or --data)")
    with open(path) as f:
        data = json.load(f)[: args.conversations]
    rows = [r for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            sys.exit(f"unknown row {r!r} (rows: {', '.join(ROWS)})")
    if args.messages_only:
        # Nothing listens on the discard port: each extraction fails at
        # once, and its conversation stays stored and indexed.
        extract_url = "http://127.0.0.1:9/v1"
        rows = [r for r in rows if r in ("bm25", "turns", "messages")]
    url = args.llm_url or subprocess.run([os.path.join(here, "llm-setup.sh"), "start"], check=True,
                                         capture_output=True, text=True).stdout.strip()
    model = Model(url, args.cache)

    convs = []
    for c in data:
        cv = c["conversation"]
        a, b = cv["speaker_a"], cv["speaker_b"]
        ss = sessions_of(cv, args.sessions)
        have = {n for n, _, _ in ss}
        qs = [q for q in c["qa"] if evidence(q) and {s for s, _ in evidence(q)} <= have]
        convs.append({"id": c["sample_id"], "a": a, "b": b, "sessions": ss, "qa": qs})
    users = [x.lower() for c in convs for x in (c["a"], c["b"])]
    if len(set(users)) != len(users):
        sys.exit("two speakers share a first name: the copies would collide")

    if args.sample is not None:
        import random
        by_cat = defaultdict(list)
        for c in convs:
            for q in c["qa"]:
                by_cat[q["category"]].append(id(q))
        asked = set()
        # Each seed draws its own sample; their union is asked (a second
        # seed widens a sample whose answers are cached).
        for seed in (int(x) for x in args.sample_seeds.split(",") if x):
            rnd = random.Random(seed)
            for k, ids in sorted(by_cat.items()):
                asked |= set(rnd.sample(ids, min(args.sample, len(ids))))
    else:
        asked = None
    answer_cats = {int(k) for k in args.categories.split(",") if k}
    if args.resume:
        args.reuse = args.resume
        pinned = os.path.join(args.resume, "ctxfs")
        if os.path.exists(pinned):
            args.bin = pinned
        print(f"resuming {args.resume} with {args.bin}", file=sys.stderr)
    if args.reuse:
        tmp = args.reuse
        mnt = os.path.join(tmp, "mnt")
        if args.reindex and not args.resume:
            # Search reads what the index holds (a message's label and its
            # speaker among it): index the kept data again with this binary.
            subprocess.run([args.bin, "reindex", "--data", os.path.join(tmp, "data"), "--config",
                            os.path.join(tmp, "config.toml"), "--model-dir", os.path.abspath(args.model_dir)],
                           check=True)
        subprocess.run([args.bin, "mount", mnt, "--data", os.path.join(tmp, "data"), "--config",
                        os.path.join(tmp, "config.toml"), "--model-dir", os.path.abspath(args.model_dir)],
                       check=True)
        # Searched before its vectors load, an account answers from the
        # lexical channel alone: load both first.
        for scope in ("accounts/eval", "accounts/turns"):
            search(mnt, scope, "warm up", k=1)
        for _ in range(600):
            with open(os.path.join(mnt, ".ctxfs", "status")) as f:
                if json.load(f)["indexer"].get("accounts_loading_vectors", 0) == 0:
                    break
            time.sleep(0.1)
    else:
        tmp, mnt = mount_with_llm(args.bin, args.model_dir, "ctxfs-eval-locomo-", ["eval", "turns"],
                                  extract_url if args.messages_only else url, memories=args.memories)
        if args.keep:
            # The binary that started the run finishes it (--resume).
            subprocess.run(["cp", args.bin, os.path.join(tmp, "ctxfs")], check=True)
    ext = {"jobs": 0, "tokens": 0, "prompt": [], "secs": [], "failed": 0, "memories": 0, "dropped": 0,
           "messages": 0}
    log_path = os.path.join(tmp, "extractions.jsonl")
    if args.resume and os.path.exists(log_path):
        with open(log_path) as f:
            for line in f:
                r = json.loads(line)
                ext["jobs"] += 1
                ext["messages"] += r["messages"]
                ext["secs"].append(r["secs"])
                ext["tokens"] += r["tokens"]
                ext["prompt"].append(r["prompt"])
                ext["failed"] += r["state"] != "done"
                ext["dropped"] += r["dropped"]
                ext["memories"] += r["made"]
    t0 = time.time()
    try:
        for c in ([] if args.reuse and not args.resume else convs):
            for n, when, turns in c["sessions"]:
                for me in (c["a"], c["b"]):
                    u = me.lower()
                    inbox = os.path.join(mnt, "accounts", "eval", "users", u, "inbox")
                    os.makedirs(inbox, exist_ok=True)
                    if args.resume and os.path.exists(os.path.join(inbox, f"s{n}.json")):
                        # Fed before: wait for it if it was left in flight.
                        wait_status(mnt, inbox, f"s{n}", limit=3600)
                        continue
                    doc = {"session": f"{c['id']}-s{n}", "messages": [
                        {"role": "user" if who == me else "assistant", "name": who, "content": text,
                         "ts": (when + dt.timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")}
                        for i, (who, text) in enumerate(turns)]}
                    t = time.time()
                    with open(os.path.join(inbox, f"s{n}.json"), "w") as f:
                        f.write(json.dumps(doc))
                    if args.messages_only:
                        continue
                    s = wait_status(mnt, inbox, f"s{n}", limit=3600)
                    secs = time.time() - t
                    ext["jobs"] += 1
                    ext["messages"] += len(turns)
                    ext["secs"].append(secs)
                    ext["tokens"] += s.get("tokens", {}).get("total", 0)
                    ext["prompt"].append(s.get("tokens", {}).get("prompt", 0))
                    ext["failed"] += s["state"] != "done"
                    ext["dropped"] += len(s.get("dropped", []))
                    made = sum(1 for ch in s.get("changes", []) if ch["action"] in ("created", "appended"))
                    ext["memories"] += made
                    with open(log_path, "a") as f:
                        f.write(json.dumps({"conv": c["id"], "user": u, "session": n, "state": s["state"],
                                            "messages": len(turns), "secs": secs,
                                            "tokens": s.get("tokens", {}).get("total", 0),
                                            "prompt": s.get("tokens", {}).get("prompt", 0),
                                            "dropped": len(s.get("dropped", [])), "made": made}) + "\n")
                    print(f"  {c['id']} {u} s{n}: {s['state']}, {len(turns)} messages, {made} new memories, "
                          f"{s.get('tokens', {}).get('total', 0)} tokens, {secs:.1f} s"
                          + (f" ({s.get('error') or s.get('reason')})" if s["state"] == "failed" else ""),
                          file=sys.stderr)
                    wait_sync(mnt)
            turns_dir = os.path.join(mnt, "accounts", "turns", "users", c["id"], "memories", "turns")
            lines = [json.dumps({"node": f"users/{c['id']}/memories/turns/s{n}-m{i}",
                                 "content": turn_line(when, who, text) + "\n",
                                 "meta": {"status": "ACTIVE"}})
                     for n, when, turns in c["sessions"] for i, (who, text) in enumerate(turns)
                     if not os.path.exists(os.path.join(turns_dir, f"s{n}-m{i}"))]
            if lines:
                with open(os.path.join(mnt, "accounts", "turns", ".ctxfs", "batch"), "w") as f:
                    f.write("\n".join(lines) + "\n")
        wait_sync(mnt)
        extract_secs = time.time() - t0

        if args.audit:
            audit(mnt, convs, args.audit)

        score = defaultdict(list)  # (row, category) -> [F1]
        unknown = defaultdict(list)  # row -> [answered unknown] over category 5
        recall = defaultdict(list)  # (row, category) -> [0/1]
        ctx_tokens = defaultdict(list)
        t1 = time.time()
        nq = 0
        for c in convs:
            turns = [((n, i), turn_line(when, who, text)) for n, when, ts in c["sessions"]
                     for i, (who, text) in enumerate(ts)]
            whole = "\n".join(t for _, t in turns)
            fits = len(whole) / 4 <= WHOLE_MAX_TOKENS
            # Speaker A's questions, then B's: the whole-history prompts of
            # one copy then share their long prefix, which the model's
            # server keeps (a minute a prompt otherwise, on 2 cores).
            for q in sorted(c["qa"], key=lambda q: copy_for(q["question"], c["a"], c["b"]) != c["a"]):
                nq += 1
                cat = q["category"]
                want = evidence(q)
                by_session = {n: turns for n, _, turns in c["sessions"]}
                me = copy_for(q["question"], c["a"], c["b"])
                other = c["b"] if me == c["a"] else c["a"]
                root = f"accounts/eval/users/{me.lower()}"
                got = {"none": ([], set())}
                ranked = bm25_rank([t for _, t in turns], q["question"])[:10]
                got["bm25"] = ([turns[i][1] for i in ranked], {turns[i][0] for i in ranked})
                texts, ids = [], set()
                for p, _ in search(mnt, f"accounts/turns/users/{c['id']}/memories", q["question"]):
                    m = re.search(r"/s(\d+)-m(\d+)$", p)
                    ids.add((int(m[1]), int(m[2])))
                    texts.append(node_body(mnt, p))
                got["turns"] = (texts, ids)
                for row in ("messages", "mem+conv"):
                    if args.messages_only and row == "mem+conv":
                        continue
                    texts, ids = [], set()
                    if row == "messages":
                        hits = messages_alone(mnt, root, q["question"])
                    else:
                        hits = search_lines(mnt, root, q["question"])
                    for p, spec, whole in hits:
                        m = MSG.search(p)
                        if m:
                            # The message whole, as the search's JSON gives
                            # it (relative times with their day), else as
                            # `cat` of the path before `#` gives it (the
                            # result line's abstract is cut at 160 characters).
                            texts.append(message_line(mnt, p, me, other, whole))
                            ids.add((int(m[1]), int(m[2])))
                        else:
                            text, from_ids = memory_read(mnt, p, spec, by_session)
                            texts.append(text)
                            ids |= from_ids
                    got[row] = (texts, ids)
                # Within a budget: ctxfs's own packing is the context.
                if not args.messages_only:
                    with open(os.path.join(mnt, root, ".search", query_name(q["question"], f"budget={PACKED_BUDGET}"))) as f:
                        packed = f.read()
                    ids = set()
                    blocks = re.split(r"^(?=## \d+\. \S+ )", packed, flags=re.M)
                    for block in blocks:
                        head = re.match(r"## \d+\. (\S+) ", block)
                        if not head:
                            continue
                        # Paths are relative to the directory searched.
                        p = head[1] if head[1].startswith("accounts/") else f"{root}/{head[1]}"
                        m = MSG.search(p)
                        if m:
                            ids.add((int(m[1]), int(m[2])))
                        else:
                            ids |= messages_shown(mnt, p, block, by_session)
                    got["packed"] = ([packed], ids)
                if fits:
                    got["whole"] = ([whole], {t for t, _ in turns})
                for row in ROWS:
                    if row not in got:
                        continue
                    texts, ids = got[row]
                    if row not in ("none", "whole"):
                        hit = 1 if ids & want else 0
                        recall[(row, cat)].append(hit)
                        recall[(row, "all")].append(hit)
                        if args.verbose and not hit and row == ("messages" if args.messages_only else "mem+conv"):
                            print(f"  [{row}] evidence missed: {q['question']} (evidence {sorted(want)})",
                                  file=sys.stderr)
                    if args.no_answers or row not in rows or (asked is not None and id(q) not in asked) \
                            or cat not in answer_cats:
                        continue
                    context = texts[0] if row in ("whole", "packed") else "\n".join(f"- {t}" for t in texts)
                    ans = model.answer(me, other, context, q["question"])
                    gold = "unknown" if cat == 5 else str(q.get("answer", ""))
                    s = f1(ans, gold)
                    score[(row, cat)].append(s)
                    score[(row, "all")].append(s)
                    ctx_tokens[row].append(len(context) / 4)
                    if cat == 5:
                        unknown[row].append(1 if "unknown" in ans.lower() else 0)
                    if args.verbose and row in ("mem+conv", "bm25") + (("messages",) if args.messages_only else ()):
                        print(f"  [{row}] {q['question']} -> {ans!r} (gold {gold!r}, F1 {s:.2f})", file=sys.stderr)
        model.save()
        answer_secs = time.time() - t1
        cats = [1, 2, 3, 4, 5]
        print(f"\n{len(convs)} conversations, sessions {'all' if args.sessions is None else f'1-{args.sessions}'}, "
              f"{nq} questions; {ext['jobs']} extractions, extraction and indexing {extract_secs:.0f} s, "
              f"search and answers {answer_secs:.0f} s ({model.calls} model calls, the rest cached)")
        print("\nEvidence recall@10:\n")
        print("| searched | " + " | ".join(CATEGORIES[k] for k in cats) + " | **all** |")
        print("|---|" + "---|" * (len(cats) + 1))
        for row in ("bm25", "turns", "messages", "mem+conv", "packed"):
            cells = []
            for k in cats + ["all"]:
                v = recall[(row, k)]
                cells.append(f"{sum(v) / len(v):.3f}" if v else "-")
            print(f"| {row} | " + " | ".join(cells) + " |")
        if not args.no_answers:
            print("\nAnswer token F1 (category 5: 1 for \"unknown\"):\n")
            print("| memory front | " + " | ".join(CATEGORIES[k] for k in cats)
                  + " | **all** | cat. 5 \"unknown\" | questions | context tokens |")
            print("|---|" + "---|" * (len(cats) + 4))
            for row in rows:
                cells = []
                for k in cats + ["all"]:
                    v = score[(row, k)]
                    cells.append(f"{sum(v) / len(v):.3f}" if v else "-")
                u = unknown[row]
                toks = ctx_tokens[row]
                print(f"| {row} | " + " | ".join(cells) + f" | {sum(u) / len(u) if u else 0:.3f} | "
                      f"{len(score[(row, 'all')])} | {sum(toks) / max(1, len(toks)):.0f} |")
            base = score[("bm25", "all")]
            mine = score[("mem+conv", "all")]
            if base and mine and sum(base):
                print(f"\nmem+conv / bm25 F1: {(sum(mine) / len(mine)) / (sum(base) / len(base)):.2f}x")
                for k in (1, 2):
                    b, m = score[("bm25", k)], score[("mem+conv", k)]
                    if b and m and sum(b):
                        print(f"  {CATEGORIES[k]}: {(sum(m) / len(m)) / (sum(b) / len(b)):.2f}x")
        if ext["jobs"]:
            secs = sorted(ext["secs"])
            prompt = sorted(ext["prompt"])
            j = ext["jobs"]
            print(f"\nper session and copy ({j} extractions, {ext['failed']} not done): "
                  f"{ext['messages'] / j:.1f} messages, {ext['memories'] / j:.1f} memories created or appended, "
                  f"{ext['tokens'] / j:.0f} tokens (prompt p50 {prompt[len(prompt) // 2]}, max {prompt[-1]}), "
                  f"{sum(secs) / j:.1f} s mean, p50 {secs[len(secs) // 2]:.1f} s, max {secs[-1]:.1f} s; "
                  f"{ext['dropped'] / j:.1f} sentences or memories dropped by the checks")
    finally:
        model.save()
        subprocess.run([args.bin, "umount", mnt])
        if args.keep or args.reuse:
            print(f"data kept in {tmp} (--reuse {tmp})", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", tmp])


CONVERSATIONS = {}


def message_line(mnt, path, me, other, whole=None):
    """`[date] Speaker: text` of the message at search path `…/NAME.json#N`
    (`whole`: its text as the search gave it, else as stored)."""
    conv, n = path.rsplit("#", 1)
    if conv not in CONVERSATIONS:
        with open(os.path.join(mnt, conv)) as f:
            CONVERSATIONS[conv] = json.load(f)["messages"]
    m = CONVERSATIONS[conv][int(n)]
    return f"[{m['ts'][:10]}] {me if m['role'] == 'user' else other}: {whole or m['content']}"


# A memory of at most this many lines is read whole; a longer one by the
# lines its search result names (LINES, as `sed -n` reads them).
READ_WHOLE = 12


def search_json(mnt, scope, q, k):
    """The results of `scope`'s search in its JSON form."""
    with open(os.path.join(mnt, scope, ".search", query_name(q, f"k={k}&format=json"))) as f:
        return json.load(f)["results"]


def messages_alone(mnt, scope, q, k=10):
    """[(path, "-", text)] of the top `k` messages of `scope`'s search: the
    stored conversations alone. A message keeps its own score where a memory
    brings it up (one result per source), so their own order is by score."""
    msgs = [r for r in search_json(mnt, scope, q, MESSAGES_K) if MSG.search(r["path"])]
    msgs.sort(key=lambda r: -r["score"])
    return [(r["path"], "-", r.get("text")) for r in msgs[:k]]


def search_lines(mnt, scope, q, k=10):
    """[(path, LINES, message text or None)] of `scope`'s search."""
    return [(r["path"], ",".join(str(n) for n in r["lines"]) or "-", r.get("text"))
            for r in search_json(mnt, scope, q, k)]


def line_numbers(spec):
    """1-based line numbers of a LINES column (`3,5-7`; `-`: none)."""
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        if a.isdigit():
            out.extend(range(int(a), int(b or a) + 1) if (b or a).isdigit() else [int(a)])
    return out


def line_messages(line, prov, by_session):
    """The messages of `prov` a quoted memory line copies (by its words)."""
    m = QUOTED.match(line.strip())
    if not m:
        return None
    parts = [_plain(x) for x in m["span"].split(" … ")]
    return {(s, i) for s, i in prov
            if s in by_session and i < len(by_session[s]) and all(x in _plain(by_session[s][i][1]) for x in parts)}


def node_provenance(mnt, path):
    return {(int(f[1:].split(".")[0]), i) for f, i in provenance(mnt, path) if re.fullmatch(r"s\d+\.json", f)}


def messages_shown(mnt, path, shown, by_session):
    """The messages of memory `path` whose lines `shown` (what the model is
    given of it: a packed result's abstract, overview and lines) holds; a
    memory of written lines counts whole when shown."""
    with open(os.path.join(mnt, path, "content.md")) as f:
        lines = f.read().split("\n")
    prov = node_provenance(mnt, path)
    text = _plain(shown)
    out, quoted = set(), False
    for line in lines:
        got = line_messages(line, prov, by_session)
        if got is None:
            continue
        quoted = True
        span = QUOTED.match(line.strip())["span"].split(" … ")[0]
        # A line shown cut (an abstract stops at 160 characters) counts by
        # its first words.
        if _plain(span)[:60] in text:
            out |= got
    return out if quoted else prov


def memory_read(mnt, path, spec, by_session):
    """(text, messages) of a memory result as an agent reads it: the whole
    `content.md` when it holds at most READ_WHOLE lines, else the lines the
    result names; the messages are those the lines read came from (a
    quoted line by its words, among the memory's provenance)."""
    with open(os.path.join(mnt, path, "content.md")) as f:
        lines = f.read().split("\n")
    body = [i for i, l in enumerate(lines, 1) if l.strip() and not (i == 1 and l.startswith("# "))]
    prov = node_provenance(mnt, path)
    if len(body) <= READ_WHOLE:
        return node_body(mnt, path), prov
    named = [n for n in line_numbers(spec) if n in body] or body[:READ_WHOLE]
    shown = [lines[n - 1].strip() for n in named]
    ids = set()
    for line in shown:
        got = line_messages(line, prov, by_session)
        # A written line names no message: the memory's own.
        ids |= prov if got is None else got
    return " ".join(" ".join(shown).split()), ids


QUOTED = re.compile(r'^(?P<who>.+?) said(?: on (?P<day>\d{4}-\d{2}-\d{2}))?: "(?P<span>.*)"$')


def _plain(text):
    """Lower-case words of `text` without its [brackets], for comparing."""
    return " ".join(re.findall(r"\w+", re.sub(r"\[[^\]]*\]", " ", text).lower()))


def quote_check(me, text, cited):
    """For a quoted memory's lines: (lines, found word for word in a cited
    message of the speaker the line names, "(the user)" exactly on the
    owner's lines). A written memory's lines count as neither."""
    lines = verbatim = owner = 0
    for line in text.splitlines():
        m = QUOTED.match(line.strip())
        if not m:
            continue
        lines += 1
        who = m["who"].removesuffix(" (the user)")
        owner += (m["who"].endswith(" (the user)")) == (who == me)
        # Each run of sentences between the cuts ("…") word for word.
        parts = [_plain(p) for p in m["span"].split(" … ")]
        # A cited message is "D1:3 Speaker: text".
        said = [c.split(" ", 2) for c in cited]
        verbatim += any(len(x) == 3 and x[1].rstrip(":") == who and all(p in _plain(x[2]) for p in parts)
                        for x in said)
    return lines, verbatim, owner


def audit(mnt, convs, out_path):
    """Every memory of every copy with its sentences and cited messages, for
    the faithfulness audit (one JSON object a line); a quoted memory's
    lines are checked word for word against the messages it cites."""
    n = 0
    tally = [0, 0, 0]
    with open(out_path, "w") as out:
        for c in convs:
            by_session = {n: turns for n, _, turns in c["sessions"]}
            for me in (c["a"], c["b"]):
                root = os.path.join(mnt, "accounts", "eval", "users", me.lower(), "memories")
                for dirpath, _, files in os.walk(root):
                    if "content.md" not in files:
                        continue
                    rel = os.path.relpath(dirpath, mnt)
                    cited = []
                    for f, i in sorted(provenance(mnt, rel)):
                        m = re.fullmatch(r"s(\d+)\.json", f)
                        if m and int(m[1]) in by_session and i < len(by_session[int(m[1])]):
                            who, text = by_session[int(m[1])][i]
                            cited.append(f"D{m[1]}:{i + 1} {who}: {text}")
                    text = node_body(mnt, rel)
                    # Line by line, as stored (the body above joins them).
                    with open(os.path.join(mnt, rel, "content.md")) as f:
                        check = quote_check(me, f.read(), cited)
                    tally = [x + y for x, y in zip(tally, check)]
                    out.write(json.dumps({"user": me, "other": c["b"] if me == c["a"] else c["a"],
                                          "node": rel, "text": text, "cited": cited,
                                          "quoted_lines": check[0], "verbatim": check[1],
                                          "speaker_right": check[2]}) + "\n")
                    n += 1
    print(f"audit: {n} memories written to {out_path}", file=sys.stderr)
    if tally[0]:
        print(f"audit: {tally[0]} quoted lines, {tally[1]} found word for word in a cited message "
              f"of the speaker they name, {tally[2]} with \"(the user)\" exactly on the owner's",
              file=sys.stderr)


if __name__ == "__main__":
    main()
