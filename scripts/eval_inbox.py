#!/usr/bin/env python3
"""Memory from conversations, evaluated through the mount.

Conversations go in through `users/U/inbox/`, a real model extracts and
merges memories, then questions are answered by search over what was
extracted. A question is answered when one of the top-k memories'
provenance (`.meta.json` "provenance": inbox file and message numbers)
covers one of the question's evidence messages: no LLM judge. Beside it,
the same questions over one node per raw message (the baseline a memory
system must beat), and: memories per conversation, the duplicate rate (a
fact said in two conversations that ends up in two nodes), tokens and
extraction time per conversation.

The data is generated here with a fixed seed (the method: per user, two
sessions of small talk around stated facts: name, job and city, two
preferences, a pet, a relative, a trip; the second session moves the user
to another city (a contradiction) and restates one preference (a
duplicate)), so every evidence message is known exactly.

    python3 scripts/eval_inbox.py --bin target/release/ctxfs --users 10
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mountutil import mount_with_llm, query_name, wait_sync  # noqa: E402

NAMES = ["Priya", "Tomas", "Aiko", "Marcus", "Leila", "Owen", "Sofia", "Kwame", "Ingrid", "Ravi",
         "Chloe", "Mateo", "Hana", "Dmitri", "Zara", "Felix"]
JOBS = ["nurse", "data engineer", "high school chemistry teacher", "carpenter", "pastry chef",
        "civil engineer", "radio journalist", "veterinarian", "bus driver", "architect"]
CITIES = ["Austin", "Lyon", "Osaka", "Leeds", "Porto", "Denver", "Tallinn", "Nairobi", "Auckland", "Montreal",
          "Valencia", "Bergen"]
DRINKS = ["green tea", "oat milk lattes", "black coffee", "hibiscus tea", "sparkling water", "chai"]
FOODS = ["spicy Thai curries", "vegetarian ramen", "Neapolitan pizza", "Ethiopian injera", "sushi", "lentil soup"]
STYLES = ["short answers with bullet points", "detailed step-by-step explanations", "answers with Python examples",
          "no emojis in replies"]
PETS = [("dog", ["Biscuit", "Pepper", "Juno"]), ("cat", ["Miso", "Tofu", "Luna"]), ("parrot", ["Kiwi", "Mango"]),
        ("rabbit", ["Clover", "Hazel"])]
RELATIVES = ["sister", "brother", "cousin", "grandmother"]
REL_NAMES = ["Anya", "Ben", "Carla", "Diego", "Elena", "Farid", "Greta", "Hugo"]
HOBBIES = ["bouldering", "sourdough baking", "birdwatching", "playing the cello", "trail running", "chess"]
PLACES = ["Iceland", "Morocco", "Vietnam", "Patagonia", "Scotland", "Japan", "Peru"]
MONTHS = ["March", "April", "May", "June", "September", "October"]
SMALL = [("How is your day going?", "Pretty good, thanks for asking! What can I do for you?"),
         ("Can you recommend a good podcast?", "Sure, what topics do you enjoy?"),
         ("What's the capital of Australia?", "Canberra."),
         ("Tell me a fun fact.", "Octopuses have three hearts."),
         ("Thanks, that's all for now.", "You're welcome, talk soon!")]


def gen_user(rng, i):
    name = NAMES[i % len(NAMES)]
    job, city = rng.choice(JOBS), rng.choice(CITIES)
    city2 = rng.choice([c for c in CITIES if c != city])
    drink, food, style = rng.choice(DRINKS), rng.choice(FOODS), rng.choice(STYLES)
    species, pnames = rng.choice(PETS)
    pet = rng.choice(pnames)
    rel, rel_name = rng.choice(RELATIVES), rng.choice(REL_NAMES)
    hobby, place, month = rng.choice(HOBBIES), rng.choice(PLACES), rng.choice(MONTHS)
    s1 = [
        ("user", f"Hi, I'm {name}. I work as a {job} in {city}."),
        ("assistant", f"Nice to meet you, {name}! How can I help?"),
        ("user", f"For future chats: I prefer {style}."),
        ("assistant", "Noted, I'll keep that in mind."),
        ("user", SMALL[0][0]), ("assistant", SMALL[0][1]),
        ("user", f"My {species} {pet} has been keeping me busy lately."),
        ("assistant", f"{pet} sounds like great company!"),
        ("user", f"By the way, I really love {drink}; I have it every morning."),
        ("assistant", "A good morning ritual!"),
        ("user", f"My {rel} {rel_name} is visiting next weekend and we're going {hobby} together."),
        ("assistant", f"Have fun with {rel_name}!"),
    ]
    s2 = [
        ("user", f"Big news: I moved from {city} to {city2} last month, same job."),
        ("assistant", f"Congratulations on the move to {city2}!"),
        ("user", SMALL[2][0]), ("assistant", SMALL[2][1]),
        ("user", f"I'm planning a trip to {place} in {month}."),
        ("assistant", f"{place} in {month} sounds wonderful."),
        ("user", f"And I still love {drink}, found a great cafe for it."),
        ("assistant", "Nice find!"),
        ("user", f"Also, I can't get enough of {food} these days."),
        ("assistant", "Yum."),
        ("user", SMALL[4][0]), ("assistant", SMALL[4][1]),
    ]
    # Questions: (text, [(session, message index), ...]) of evidence.
    qs = [
        (f"What does {name} do for work?", [(1, 0)]),
        (f"Which city does {name} live in now?", [(2, 0)]),
        (f"How does {name} like answers to be written?", [(1, 2)]),
        (f"What is the name of {name}'s {species}?", [(1, 6)]),
        (f"What does {name} drink in the morning?", [(1, 8), (2, 6)]),
        (f"Who is visiting {name} next weekend?", [(1, 10)]),
        (f"Where is {name} travelling to?", [(2, 4)]),
        (f"What food does {name} enjoy?", [(2, 8)]),
    ]
    # The fact said twice (for the duplicate rate): the drink.
    repeated = [[(1, 8), (2, 6)]]
    return name.lower(), s1, s2, qs, repeated


def words(text):
    return [w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if w]


def bm25_rank(docs, query, k1=1.2, b=0.75):
    """Indexes of `docs` by BM25 score for `query`, best first."""
    import math
    toks = [words(d) for d in docs]
    avg = sum(len(t) for t in toks) / max(1, len(toks))
    df = {}
    for t in toks:
        for w in set(t):
            df[w] = df.get(w, 0) + 1
    n = len(docs)
    scores = []
    for i, t in enumerate(toks):
        s = 0.0
        for w in set(words(query)):
            f = t.count(w)
            if f:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(t) / avg))
        scores.append((s, i))
    return [i for s, i in sorted(scores, key=lambda x: (-x[0], x[1]))]


def conv_json(msgs, session):
    return json.dumps({"session": session, "messages": [{"role": r, "content": c} for r, c in msgs]})


def search(mnt, scope, q, k):
    with open(os.path.join(mnt, scope, ".search", query_name(q, f"k={k}&mode=hybrid"))) as f:
        text = f.read()
    return [line.split("\t")[2] for line in text.splitlines() if line.strip()]


def provenance(mnt, path):
    """(inbox file, message) pairs the node's current text comes from; for
    a conversation's message in search (`…/inbox/NAME.json#N`), itself."""
    if "#" in path:
        conv, n = path.rsplit("#", 1)
        return {(conv.rsplit("/", 1)[-1], int(n))}
    with open(os.path.join(mnt, path, ".meta.json")) as f:
        meta = json.load(f)
    out = set()
    for p in meta.get("sources") or [meta.get("provenance", {})]:
        f = p.get("inbox", "").rsplit("/", 1)[-1]
        out |= {(f, m) for m in p.get("messages", [])}
    return out


def wait_status(mnt, inbox, name, limit=900):
    t = time.time()
    while time.time() - t < limit:
        try:
            with open(os.path.join(inbox, name + ".status")) as f:
                s = json.load(f)
            if s["state"] in ("done", "failed", "review"):
                return s
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    sys.exit(f"{name}: extraction did not finish in {limit} s")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--bin", default=os.environ.get("CTXFS_BIN", "target/release/ctxfs"))
    ap.add_argument("--model-dir", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--llm-url", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    url = args.llm_url or subprocess.run([os.path.join(here, "llm-setup.sh"), "start"], check=True,
                                         capture_output=True, text=True).stdout.strip()
    rng = random.Random(7)
    users = [gen_user(rng, i) for i in range(args.users)]
    tmp, mnt = mount_with_llm(args.bin, args.model_dir, "ctxfs-eval-inbox-", ["eval", "raw"], url)
    try:
        stats = {"conversations": 0, "memories": 0, "tokens": 0, "secs": [], "failed": 0}
        t0 = time.time()
        for u, s1, s2, _, _ in users:
            base = os.path.join(mnt, "accounts", "eval", "users", u)
            os.makedirs(base, exist_ok=True)
            inbox = os.path.join(base, "inbox")
            for n, msgs in ((1, s1), (2, s2)):
                t = time.time()
                with open(os.path.join(inbox, f"s{n}.json"), "w") as f:
                    f.write(conv_json(msgs, f"{u}-{n}"))
                s = wait_status(mnt, inbox, f"s{n}")
                stats["secs"].append(time.time() - t)
                stats["conversations"] += 1
                stats["tokens"] += s["tokens"]["total"]
                stats["failed"] += s["state"] != "done"
                stats["memories"] += sum(1 for c in s["changes"] if c["action"] in ("created", "appended"))
                print(f"  {u} s{n}: {s['state']}, {len(s['changes'])} changes, {s['tokens']['total']} tokens, "
                      f"{time.time() - t:.1f} s", file=sys.stderr)
                # The next conversation compares with this one's memories.
                wait_sync(mnt)
            # The baseline: one node per raw message, same provenance form.
            lines = []
            for n, msgs in ((1, s1), (2, s2)):
                for i, (role, text) in enumerate(msgs):
                    lines.append(json.dumps({"node": f"users/{u}/memories/messages/s{n}-m{i}",
                                             "content": f"{role}: {text}",
                                             "meta": {"status": "ACTIVE", "provenance": {
                                                 "inbox": f"users/{u}/inbox/s{n}.json", "messages": [i]}}}))
            with open(os.path.join(mnt, "accounts", "raw", ".ctxfs", "batch"), "w") as f:
                f.write("\n".join(lines) + "\n")
        total = time.time() - t0
        wait_sync(mnt)
        ks = (1, 3, 10)
        hit = {("extracted", k): 0 for k in ks}
        hit.update({("with-conv", k): 0 for k in ks})
        hit.update({("raw", k): 0 for k in ks})
        hit.update({("bm25", k): 0 for k in ks})
        nq = 0
        for u, s1, s2, qs, _ in users:
            turns = [(f"s{n}.json", i, f"{r}: {t}") for n, msgs in ((1, s1), (2, s2))
                     for i, (r, t) in enumerate(msgs)]
            for q, ev in qs:
                nq += 1
                want = {(f"s{s}.json", m) for s, m in ev}
                ranked = bm25_rank([t for _, _, t in turns], q)
                for k in ks:
                    if any((turns[i][0], turns[i][1]) in want for i in ranked[:k]):
                        hit[("bm25", k)] += 1
                for label, scope in (("extracted", f"accounts/eval/users/{u}/memories"),
                                     ("with-conv", f"accounts/eval/users/{u}"),
                                     ("raw", f"accounts/raw/users/{u}")):
                    paths = search(mnt, scope, q, 10)
                    for k in ks:
                        if any(provenance(mnt, p) & want for p in paths[:k]):
                            hit[(label, k)] += 1
                    if label == "extracted" and args.verbose and not any(provenance(mnt, p) & want for p in paths):
                        print(f"  missed: {q} (evidence {sorted(want)}; top: {paths[:3]})", file=sys.stderr)
        # Duplicates: a fact said in both conversations, held by more than one node.
        dup = rep = 0
        for u, _, _, _, repeated in users:
            nodes = []
            root = os.path.join(mnt, "accounts", "eval", "users", u, "memories")
            for dirpath, _, files in os.walk(root):
                if ".meta.json" in files:
                    nodes.append(os.path.relpath(dirpath, mnt))
            for ev in repeated:
                rep += 1
                want = {(f"s{s}.json", m) for s, m in ev}
                holders = [n for n in nodes if provenance(mnt, n) & want]
                # The same fact twice: two nodes of one category directory.
                dirs = [os.path.dirname(n) for n in holders]
                twice = len(dirs) != len(set(dirs))
                dup += twice
                if twice or args.verbose:
                    print(f"  {u}: the repeated fact is held by {holders}", file=sys.stderr)
        secs = sorted(stats["secs"])
        c = stats["conversations"]
        print(f"\n{args.users} users, {c} conversations ({stats['failed']} failed), {nq} questions, "
              f"{total:.0f} s in all")
        print("\n| memories searched | recall@1 | recall@3 | recall@10 |")
        print("|---|---|---|---|")
        for label, what in (("extracted", "extracted by the inbox (ctxfs search)"),
                            ("with-conv", "extracted, and the conversations' messages (ctxfs search)"),
                            ("raw", "one node per raw message (ctxfs search)"),
                            ("bm25", "raw messages, BM25 (computed by this harness)")):
            print(f"| {what} | " + " | ".join(f"{hit[(label, k)] / nq:.3f}" for k in ks) + " |")
        print("\n| per conversation | value |")
        print("|---|---|")
        print(f"| memories created or appended | {stats['memories'] / c:.1f} |")
        print(f"| tokens spent | {stats['tokens'] / c:.0f} |")
        print(f"| extraction time p50 / max (s) | {secs[len(secs) // 2]:.1f} / {secs[-1]:.1f} |")
        print(f"| duplicate rate (a repeated fact in two nodes) | {dup}/{rep} |")
    finally:
        subprocess.run([args.bin, "umount", mnt])
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
