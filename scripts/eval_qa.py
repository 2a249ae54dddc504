#!/usr/bin/env python3
"""Answers, end to end: questions answered by the local model from what each
memory front returns, scored by token F1 against gold answers (judge-free,
as the original LoCoMo scoring) and by evidence recall@10.

Rows (the same questions, the same model, the same prompt):
  none         no memory at all
  bm25         BM25 over the raw turns (computed here), top 10 turns
  turns        ctxfs search over every turn as a node, top 10
  memories     ctxfs search over the memories the inbox extracted, top 10
  mem+conv     ctxfs search over the memories and the stored conversations
               (the user directory: memories rank above messages), top 10
  mem+conv tree  the same with mode=tree (hierarchical: directories ranked by
               their children's abstracts, then searched inside the best 3)
  whole        the whole conversation history in the prompt (it fits the
               model's 8,192-token context here)

The data is generated here, offline, with a fixed seed. The method: per
user, five dated chat sessions over three months between the user and a
friend (the other speaker, who has facts of their own), each of 12-18 turns
with small talk, facts said in passing, relative times ("last Saturday",
"two weeks ago") said against the session's date, a move to another city
(the newer value wins) and two trips planned in different sessions. Every
question's evidence turns are known exactly. Question kinds: single fact,
multi-session, temporal ("when"; gold is the absolute date the relative
time resolves to), updated fact, a fact of the other speaker, and
unanswerable (gold "unknown": right when the answer says unknown or not
mentioned; any other answer to it, and "unknown" to a real question, is 0).
Token F1 reads a date written 2026-03-14 as 14 March 2026 (the gold form),
in every row alike.

Answers are cached by prompt (--cache), so a second run of the same build
costs no model time.

    python3 scripts/eval_qa.py --bin target/release/ctxfs --users 5
"""
import argparse
import datetime as dt
import hashlib
import json
import os
import random
import re
import string
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_inbox import bm25_rank, provenance, wait_status  # noqa: E402
from mountutil import mount_with_llm, query_name, wait_sync  # noqa: E402

NAMES = ["Priya", "Tomas", "Aiko", "Marcus", "Leila", "Owen", "Sofia", "Kwame"]
FRIENDS = ["Mel", "Jonah", "Rita", "Sam", "Nadia", "Luis", "Grace", "Ivan"]
JOBS = ["nurse", "data engineer", "carpenter", "pastry chef", "civil engineer", "radio journalist",
        "veterinarian", "architect"]
FRIEND_JOBS = ["a paramedic", "a librarian", "a dentist", "a bus driver", "a florist", "a translator"]
CITIES = ["Austin", "Porto", "Osaka", "Denver", "Tallinn", "Nairobi", "Auckland", "Montreal", "Valencia",
          "Bergen"]
PETS = [("dog", ["Biscuit", "Pepper", "Juno"]), ("cat", ["Tofu", "Luna", "Olive"]),
        ("parrot", ["Kiwi", "Mango"]), ("rabbit", ["Clover", "Hazel"])]
KIDS = ["Theo", "Ava", "Noah", "Maya", "Leo", "Iris"]
CLASSES = ["pottery", "salsa", "Italian", "climbing", "watercolour", "piano"]
PLACES = ["Iceland", "Morocco", "Vietnam", "Patagonia", "Scotland", "Japan", "Peru", "Greece"]
MONTHS = ["July", "August", "September", "October", "November"]
DRINKS = ["green tea", "oat milk lattes", "hibiscus tea", "chai"]
SMALL = [
    ("ugh, mondays. how's your week going?", "Busy but fine! Yours?"),
    ("did you watch the game last night?", "Only the second half, what a finish."),
    ("the weather has been so grey lately", "Same here, I miss the sun."),
    ("haha that meme you sent was great", "I knew you'd like it."),
    ("I need more coffee today", "Don't we all."),
    ("any good show recommendations?", "Try the new detective series, it's fun."),
    ("traffic was awful this morning", "Ugh, sorry. Podcast at least?"),
    ("ok I should get back to work", "Same, talk later!"),
]


def fmt(d):
    return f"{d.day} {d.strftime('%B')} {d.year}"


def article(word):
    return "an" if word[0] in "aeiou" else "a"


def last_weekday(d, weekday):
    """The last `weekday` (0 Monday) strictly before date `d`."""
    back = (d.weekday() - weekday) % 7 or 7
    return d - dt.timedelta(days=back)


def gen_user(rng, i):
    name, friend = NAMES[i % len(NAMES)], FRIENDS[i % len(FRIENDS)]
    job, fjob = rng.choice(JOBS), rng.choice(FRIEND_JOBS)
    city, city2 = rng.sample(CITIES, 2)
    species, pnames = rng.choice(PETS)
    pet = rng.choice(pnames)
    other_species = rng.choice([s for s, _ in PETS if s != species])
    kid, cls = rng.choice(KIDS), rng.choice(CLASSES)
    place1, place2 = rng.sample(PLACES, 2)
    m1, m2 = rng.sample(MONTHS, 2)
    drink = rng.choice(DRINKS)
    start = dt.date(2026, 3, 2) + dt.timedelta(days=rng.randrange(0, 10))
    dates = [start + dt.timedelta(days=d) for d in (0, 17, 38, 61, 86)]
    race = last_weekday(dates[1], 5)  # "last Saturday"
    class_start = dates[2] - dt.timedelta(days=14)  # "two weeks ago"
    small = rng.sample(SMALL, 8)
    U, F = "user", "assistant"
    sessions = [
        [(U, f"hey {friend}! long time. how are you?"), (F, f"{name}! good good. still working as {fjob}, still tired haha"),
         (U, small[0][0]), (F, small[0][1]),
         (U, f"so I finally started the new job, I'm {article(job)} {job} now, at a small company here in {city}"),
         (F, "congrats!! that's huge"),
         (U, f"thanks! also my {species} {pet} has been chewing everything lol"),
         (F, f"haha poor {pet}, sounds like a handful"),
         (U, small[1][0]), (F, small[1][1]),
         (U, f"I've been drinking way too much {drink} to survive the first week"),
         (F, "whatever works"),
         (U, small[7][0]), (F, small[7][1])],
        [(U, small[2][0]), (F, small[2][1]),
         (U, "guess what, last Saturday I ran my first half marathon!"),
         (F, "no way, how did it go?"),
         (U, "slow but I finished, 2 hours 14 minutes. legs still hate me"),
         (F, f"that's amazing. my son {kid} just started kindergarten this week btw"),
         (U, f"aww, say hi to {kid}! is he excited?"),
         (F, "he cried on day one and now he loves it"),
         (U, f"also I'm planning a trip to {place1} in {m1}, first real holiday in ages"),
         (F, f"{place1}! you have to send pictures"),
         (U, small[3][0]), (F, small[3][1])],
        [(U, small[4][0]), (F, small[4][1]),
         (U, f"two weeks ago I started {cls} classes on tuesday evenings"),
         (F, f"oh fun, are you any good at {cls}?"),
         (U, "terrible, but the teacher is patient"),
         (F, "that's the spirit"),
         (U, f"{pet} keeps me company while I practise haha"),
         (F, "a very supportive audience"),
         (U, small[5][0]), (F, small[5][1]),
         (U, "work is intense this month, lots of night shifts"),
         (F, "take care of yourself")],
        [(U, f"big news: we moved to {city2} last month, the new flat is tiny but nice"),
         (F, f"wow, {city2}! why the move?"),
         (U, "my partner got a job offer there and I could transfer"),
         (F, "makes sense. do you like it so far?"),
         (U, small[6][0]), (F, small[6][1]),
         (U, f"and I booked another trip, {place2} in {m2}!"),
         (F, f"you're becoming a traveller. {place2} sounds great"),
         (U, "I still can't believe it"),
         (F, "you deserve it"),
         (U, f"btw I'm still on the {drink} every morning, some habits don't move"),
         (F, "haha of course")],
        [(U, "hiii, quick chat before my shift"),
         (F, "hey! how's the new place?"),
         (U, f"good! {city2} is growing on me"),
         (F, "glad to hear it"),
         (U, small[2][0]), (F, small[2][1]),
         (U, f"{pet} finally stopped chewing the furniture"),
         (F, "progress!"),
         (U, "ok gotta run, talk soon"),
         (F, "bye!")],
    ]
    # (question, gold, kind, evidence [(session 1-based, message)]).
    qs = [
        (f"What is the name of {name}'s {species}?", pet, "single", [(1, 6)]),
        (f"What does {name} work as?", job, "single", [(1, 4)]),
        (f"Which two places has {name} planned trips to?", f"{place1} and {place2}", "multi-session",
         [(2, 8), (4, 6)]),
        (f"When did {name} run a half marathon?", fmt(race), "temporal", [(2, 2)]),
        (f"When did {name} start {cls} classes?", fmt(class_start), "temporal", [(3, 2)]),
        (f"Which city does {name} live in now?", city2, "updated", [(4, 0)]),
        (f"What is the name of {friend}'s son?", kid, "other speaker", [(2, 5)]),
        (f"What is the name of {name}'s {other_species}?", "unknown", "unanswerable", []),
    ]
    return {"id": name.lower(), "name": name, "friend": friend, "sessions": sessions, "dates": dates,
            "true_dates": [race, class_start], "questions": qs}


def ts(d, i):
    """A message's time: the session's date, minutes apart."""
    return f"{d.isoformat()}T19:{i:02d}:00Z"


def turn_text(u, n, i):
    role, text = u["sessions"][n - 1][i]
    who = u["name"] if role == "user" else u["friend"]
    return f"[{u['dates'][n - 1].isoformat()}] {who}: {text}"


# ---- scoring (LoCoMo's normalisation: lower case, no punctuation or articles)


ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")


def norm_tokens(s):
    # A date is a date however it is written: 2026-03-14 reads as 14 March 2026.
    s = ISO_DATE.sub(lambda m: fmt(dt.date(int(m[1]), int(m[2]), int(m[3]))), s)
    s = s.lower()
    s = "".join(" " if c in string.punctuation else c for c in s)
    return [w for w in s.split() if w not in ("a", "an", "the", "and")]


def f1(pred, gold):
    if gold == "unknown":
        p = pred.lower()
        return 1.0 if any(x in p for x in ("unknown", "not mentioned", "no information", "not say",
                                             "does not mention", "not known")) else 0.0
    if "unknown" in pred.lower():
        return 0.0
    p, g = norm_tokens(pred), norm_tokens(gold)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if not p or not g or same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


# ---- the model


class Model:
    def __init__(self, url, cache_path):
        self.url = url.rstrip("/") + "/chat/completions"
        self.cache_path = cache_path
        self.cache = {}
        if cache_path and os.path.exists(cache_path):
            with open(cache_path) as f:
                self.cache = json.load(f)
        self.calls = 0
        self.secs = 0.0

    def answer(self, name, friend, context, question):
        system = (f"You answer questions about {name} and the people {name} talks with, using only the "
                  f"memory excerpts given. In them, {name} is \"the user\" (role user) and {friend} is "
                  f"the other speaker (role assistant). Answer with as few words as possible: a name, a "
                  f"place, a job, or a date as day month year. Relative times in the excerpts (\"last "
                  f"Saturday\", \"two weeks ago\") count from the date of the excerpt they are in. If the "
                  f"excerpts do not say, answer exactly: unknown")
        user = f"Memory excerpts:\n{context or '(none)'}\n\nQuestion: {question}\nAnswer:"
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        key = hashlib.sha256(json.dumps(msgs, sort_keys=True).encode()).hexdigest()
        if key in self.cache:
            return self.cache[key]
        body = json.dumps({"model": "eval", "messages": msgs, "temperature": 0, "max_tokens": 24,
                           "seed": 1}).encode()
        t = time.time()
        req = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.load(r)["choices"][0]["message"]["content"].strip().splitlines()
        self.secs += time.time() - t
        self.calls += 1
        ans = out[0].strip() if out else ""
        self.cache[key] = ans
        if self.cache_path and self.calls % 10 == 0:
            self.save()
        return ans

    def save(self):
        if self.cache_path:
            tmp = self.cache_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.cache, f)
            os.replace(tmp, self.cache_path)


# ---- the mount


def search(mnt, scope, q, k=10, mode=None):
    """[(path, abstract)] of `scope`'s search file."""
    opts = f"k={k}" + (f"&mode={mode}" if mode else "")
    with open(os.path.join(mnt, scope, ".search", query_name(q, opts))) as f:
        rows = [line.split("\t") for line in f.read().splitlines() if line.strip()]
    return [(r[2], r[4]) for r in rows]


def node_body(mnt, path):
    with open(os.path.join(mnt, path, "content.md")) as f:
        text = f.read()
    if text.startswith("# "):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    return " ".join(text.split())


VERBOSE = False
MSG = re.compile(r"/inbox/s(\d+)\.json#(\d+)$")

# Words of the extraction prompt's worked examples (src/extract/prompt.rs).
EXAMPLE_WORDS = {"dana", "chemistry", "leeds", "miso", "ruth", "pharmacist", "tom", "lyon", "paris", "paramedic",
                 "nurse", "vet"}


def faithfulness(mnt, u):
    """(sentences, supported, example leaks, misattributed) over the user's
    memories. A sentence is supported when every capitalised word after its
    first and every number in it occurs in the user's conversations (or in
    a true date of the data: a session's, or one a relative time means), and it
    does not give the user a fact of the friend (the friend's job or son in a
    sentence about "the user" that does not name the friend). Independent of
    the daemon's own check: it reads the whole history, not the cited
    messages, and knows the generator's facts."""
    said = set()
    for msgs in u["sessions"]:
        for _, text in msgs:
            said |= {w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)}
    # The true dates (sessions, and what their relative times mean) in
    # both forms: a memory may date an event the daemon resolved.
    for d in u["dates"] + u["true_dates"]:
        said |= {w.lower() for w in re.findall(r"[A-Za-z0-9]+", f"{d.isoformat()} {fmt(d)}")}
        said.add(str(d.month).zfill(2))
    friend = u["friend"].lower()
    friend_facts = set()
    for msgs in u["sessions"]:
        for role, text in msgs:
            if role == "assistant":
                m = re.search(r"working as (a|an) (\w+)|my son (\w+)", text)
                if m:
                    friend_facts |= {x.lower() for x in m.groups()[1:] if x}
    total = ok = leaks = wrong = 0
    root = os.path.join(mnt, "accounts", "eval", "users", u["id"], "memories")
    for dirpath, _, files in os.walk(root):
        if "content.md" not in files:
            continue
        text = node_body(mnt, os.path.relpath(dirpath, mnt))
        for sent in re.split(r"(?<=[.!?])\s+", text):
            words = re.findall(r"[A-Za-z0-9]+", sent)
            if not words:
                continue
            total += 1
            low = {w.lower() for w in words}
            marked = [w.lower() for w in words[1:] if w[0].isupper() or w[0].isdigit()]
            leak = (low & EXAMPLE_WORDS) - said
            misattributed = ("user" in low and friend not in low and bool(low & friend_facts))
            leaks += bool(leak)
            wrong += misattributed
            if all(w in said for w in marked) and not leak and not misattributed:
                ok += 1
            elif VERBOSE:
                print(f"  unsupported ({u['id']}): {sent}", file=sys.stderr)
    return total, ok, leaks, wrong


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bin", default=os.environ.get("CTXFS_BIN", "target/release/ctxfs"))
    ap.add_argument("--model-dir", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--users", type=int, default=5)
    ap.add_argument("--llm-url", default=None)
    ap.add_argument("--cache", default="/var/tmp/ctxfs-llm/qa-answers.json")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (its path is printed)")
    ap.add_argument("--reuse", help="a directory kept by --keep: answer again from its memories, "
                    "without extracting (to compare search settings on the same memories)")
    args = ap.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    url = args.llm_url or subprocess.run([os.path.join(here, "llm-setup.sh"), "start"], check=True,
                                         capture_output=True, text=True).stdout.strip()
    model = Model(url, args.cache)
    rng = random.Random(11)
    users = [gen_user(rng, i) for i in range(args.users)]
    if args.reuse:
        tmp = args.reuse
        mnt = os.path.join(tmp, "mnt")
        subprocess.run([args.bin, "mount", mnt, "--data", os.path.join(tmp, "data"), "--config",
                        os.path.join(tmp, "config.toml"), "--model-dir", os.path.abspath(args.model_dir)],
                       check=True)
    else:
        tmp, mnt = mount_with_llm(args.bin, args.model_dir, "ctxfs-eval-qa-", ["eval", "turns"], url)
    t0 = time.time()
    ext = {"conversations": 0, "tokens": 0, "secs": [], "failed": 0, "memories": 0, "dropped": 0}
    try:
        for u in ([] if args.reuse else users):
            base = os.path.join(mnt, "accounts", "eval", "users", u["id"])
            os.makedirs(base, exist_ok=True)
            inbox = os.path.join(base, "inbox")
            for n, msgs in enumerate(u["sessions"], 1):
                t = time.time()
                conv = {"session": f"{u['id']}-{n}",
                        "messages": [{"role": r, "content": c, "ts": ts(u["dates"][n - 1], i)}
                                     for i, (r, c) in enumerate(msgs)]}
                with open(os.path.join(inbox, f"s{n}.json"), "w") as f:
                    f.write(json.dumps(conv))
                s = wait_status(mnt, inbox, f"s{n}", limit=1800)
                ext["secs"].append(time.time() - t)
                ext["conversations"] += 1
                ext["tokens"] += s["tokens"]["total"]
                ext["failed"] += s["state"] != "done"
                ext["dropped"] += len(s.get("dropped", []))
                ext["memories"] += sum(1 for c in s["changes"] if c["action"] in ("created", "appended"))
                print(f"  {u['id']} s{n}: {s['state']}, {len(s['changes'])} changes, "
                      f"{s['tokens']['total']} tokens, {time.time() - t:.1f} s", file=sys.stderr)
                wait_sync(mnt)
            # Every turn a node, in its own account.
            lines = [json.dumps({"node": f"users/{u['id']}/memories/turns/s{n}-m{i}",
                                 "content": turn_text(u, n, i) + "\n",
                                 "meta": {"status": "ACTIVE"}})
                     for n, msgs in enumerate(u["sessions"], 1) for i in range(len(msgs))]
            with open(os.path.join(mnt, "accounts", "turns", ".ctxfs", "batch"), "w") as f:
                f.write("\n".join(lines) + "\n")
        wait_sync(mnt)
        extract_secs = time.time() - t0
        faith = [faithfulness(mnt, u) for u in users]

        rows = ["none", "bm25", "turns", "memories", "mem+conv", "mem+conv tree", "whole"]
        score = defaultdict(list)  # (row, kind) -> [f1]
        recall = defaultdict(list)  # row -> [0/1]
        ctx_tokens = defaultdict(list)
        t1 = time.time()
        for u in users:
            turns = [((n, i), turn_text(u, n, i)) for n, msgs in enumerate(u["sessions"], 1)
                     for i in range(len(msgs))]
            whole = "\n".join(t for _, t in turns)
            mem_root = f"accounts/eval/users/{u['id']}"
            for q, gold, kind, ev in u["questions"]:
                want = set(ev)
                got = {}
                # BM25 over the raw turns.
                ranked = bm25_rank([t for _, t in turns], q)[:10]
                got["bm25"] = ([turns[i][1] for i in ranked], {turns[i][0] for i in ranked})
                # Every turn a node.
                hits = search(mnt, f"accounts/turns/users/{u['id']}/memories", q)
                ids = set()
                for p, _ in hits:
                    m = re.search(r"/s(\d+)-m(\d+)$", p)
                    ids.add((int(m.group(1)), int(m.group(2))))
                got["turns"] = ([node_body(mnt, p) for p, _ in hits], ids)
                # Memories, then memories and conversations.
                for row, scope, mode in (("memories", f"{mem_root}/memories", None),
                                         ("mem+conv", mem_root, None),
                                         ("mem+conv tree", mem_root, "tree")):
                    texts, ids = [], set()
                    for p, abstract in search(mnt, scope, q, mode=mode):
                        m = MSG.search(p)
                        if m:
                            # The message as search shows it: number, role,
                            # time and text (relative times dated).
                            texts.append(abstract)
                            ids.add((int(m.group(1)), int(m.group(2))))
                        else:
                            texts.append(node_body(mnt, p))
                            ids |= {(int(f[1:].split(".")[0]), i) for f, i in provenance(mnt, p)
                                    if f.startswith("s")}
                    got[row] = (texts, ids)
                got["none"] = ([], set())
                got["whole"] = ([whole], {t for t, _ in turns})
                for row in rows:
                    texts, ids = got[row]
                    context = "\n".join(f"- {t}" for t in texts) if row != "whole" else whole
                    ans = model.answer(u["name"], u["friend"], context, q)
                    s = f1(ans, gold)
                    score[(row, kind)].append(s)
                    score[(row, "all")].append(s)
                    ctx_tokens[row].append(len(context) / 4)
                    if want and row not in ("none", "whole"):
                        recall[row].append(1 if ids & want else 0)
                        if args.verbose and row.startswith("mem+conv") and not ids & want:
                            print(f"  [{row}] evidence missed: {q} (evidence {sorted(want)})",
                                  file=sys.stderr)
                    if args.verbose and row in ("mem+conv", "bm25"):
                        print(f"  [{row}] {q} -> {ans!r} (gold {gold!r}, F1 {s:.2f})", file=sys.stderr)
        model.save()
        answer_secs = time.time() - t1
        kinds = ["single", "multi-session", "temporal", "updated", "other speaker", "unanswerable", "all"]
        nq = sum(len(u["questions"]) for u in users)
        print(f"\n{args.users} users, {ext['conversations']} conversations ({ext['failed']} failed), "
              f"{nq} questions; extraction and indexing {extract_secs:.0f} s, answers {answer_secs:.0f} s "
              f"({model.calls} model calls, the rest cached)")
        print("\n| memory front | " + " | ".join(kinds[:-1]) + " | **all** | evidence recall@10 | context tokens |")
        print("|---|" + "---|" * (len(kinds) + 2))
        for row in rows:
            cells = []
            for k in kinds:
                v = score[(row, k)]
                cells.append(f"{sum(v) / len(v):.3f}" if v else "-")
            rc = recall.get(row)
            rec = f"{sum(rc) / len(rc):.3f}" if rc else "-"
            toks = sum(ctx_tokens[row]) / len(ctx_tokens[row])
            print(f"| {row} | " + " | ".join(cells) + f" | {rec} | {toks:.0f} |")
        secs = sorted(ext["secs"]) or [0]
        c = ext["conversations"] or 1
        print(f"\nper conversation: {ext['memories'] / c:.1f} memories created or appended, "
              f"{ext['tokens'] / c:.0f} tokens, extraction p50 {secs[len(secs) // 2]:.1f} s, "
              f"{ext['dropped'] / c:.1f} sentences or memories dropped by the checks")
        tot, ok, leaks, wrong = (sum(x[i] for x in faith) for i in range(4))
        print(f"faithfulness: {ok}/{tot} memory sentences supported by the conversations "
              f"({ok / max(1, tot):.3f}); {leaks} with words of the prompt's examples, "
              f"{wrong} giving the user the friend's facts")
    finally:
        model.save()
        subprocess.run([args.bin, "umount", mnt])
        if args.keep or args.reuse:
            print(f"data kept in {tmp} (--reuse {tmp})", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
