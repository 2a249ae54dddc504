#!/usr/bin/env python3
"""Conversational memory retrieval, evaluated through the mount.

Every turn of a user's multi-session chat history is one node; a question
about the user is answered by search over that user's nodes, and counts as
found at k when one of its evidence turns is among the top k. Beside ctxfs
(hybrid, vector alone, its lexical channel), a plain BM25 over the very same
node texts, computed by this harness, is the baseline.

The data is generated here with a fixed seed, so every evidence turn is
known exactly. The method, per user:
- 20 sessions of 10 turns (user, assistant), one every 9 days from
  2026-01-05, each on an everyday topic (cooking, travel, code, money, ...).
- 14 facts about the user (pet, job, relative, allergy, car, hobby, trip,
  move, book, injury, child's school, diet, birthday, language), each said
  once by the user, in passing, inside a session on another topic; the
  assistant's reply acknowledges it. The evidence is the user's turn.
- One question per fact, asked the way an agent asks its memory ("Which
  city is Priya moving to?"). Questions are written as paraphrases of the
  fact, and every question shares words with distractor turns of the
  topic sessions ("Which city has the best museums?", "Can you recommend a
  book?"), as real chat logs do.
Two layouts of the same turns are measured: the turn alone
("Priya: ...") and with its session date ("[2026-03-14] Priya: ...").

    python3 scripts/eval_conv.py --bin target/release/ctxfs --users 10
"""
import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_inbox import bm25_rank  # noqa: E402
from mountutil import query_name, wait_sync  # noqa: E402

NAMES = ["Priya", "Tomas", "Aiko", "Marcus", "Leila", "Owen", "Sofia", "Kwame", "Ingrid", "Ravi",
         "Chloe", "Mateo", "Hana", "Dmitri", "Zara", "Felix"]


def pick(rng, xs):
    return xs[rng.randrange(len(xs))]


# Each fact: (evidence turn, assistant's reply, a question in other words,
# a question sharing words with the evidence), with {N} the
# user's name and the other fields drawn per user.
FACTS = [
    ("pet", lambda r: {"breed": pick(r, ["beagle", "greyhound", "border collie", "dachshund"]),
                       "pet": pick(r, ["Biscuit", "Pepper", "Juno", "Waffles", "Ziggy"])},
     "We finally adopted a {breed} from the shelter last weekend, we named him {pet}.",
     "Congratulations on welcoming {pet} home!",
     "What is the name of {N}'s dog?",
     "What did {N} name the {breed} from the shelter?"),
    ("job", lambda r: {"job": pick(r, ["radiographer", "structural engineer", "pastry chef", "paralegal"])},
     "I started as a {job} at a firm downtown last month, still learning the ropes.",
     "Starting somewhere new takes time, you will settle in.",
     "What does {N} do for a living?",
     "Where did {N} start working last month?"),
    ("relative", lambda r: {"rel": pick(r, ["sister", "brother", "cousin"]),
                            "rname": pick(r, ["Anya", "Ben", "Carla", "Diego", "Elena"])},
     "My {rel} {rname} just got into a nursing program, she starts in autumn.",
     "That is wonderful news for {rname}.",
     "Who in {N}'s family is training to become a nurse?",
     "Which of {N}'s relatives got into a nursing program?"),
    ("allergy", lambda r: {"food": pick(r, ["peanuts", "shellfish", "sesame", "kiwi"])},
     "Quick note: I react badly to {food}, so leave them out of anything you suggest.",
     "Noted, I will avoid {food} in suggestions.",
     "Which ingredient must be kept out of {N}'s meals?",
     "What does {N} react badly to?"),
    ("car", lambda r: {"car": pick(r, ["second-hand Prius", "Volvo estate", "small electric Renault", "Subaru Outback"])},
     "I traded in the old hatchback for a {car} on Tuesday.",
     "Enjoy the {car}!",
     "What vehicle does {N} drive now?",
     "What did {N} trade the old hatchback in for?"),
    ("hobby", lambda r: {"hobby": pick(r, ["bouldering", "pottery", "birdwatching", "cello lessons"])},
     "Saturday mornings are for {hobby} with my club, I never miss it.",
     "A regular slot like that is a great habit.",
     "How does {N} usually spend weekends?",
     "What does {N} do with the club on Saturday mornings?"),
    ("trip", lambda r: {"place": pick(r, ["Iceland", "Vietnam", "Patagonia", "Morocco"]),
                        "month": pick(r, ["May", "June", "September", "October"])},
     "We booked flights to {place} for the second week of {month}!",
     "{place} in {month} sounds amazing.",
     "Where is {N} going on holiday?",
     "Where did {N} book flights to?"),
    ("move", lambda r: {"city": pick(r, ["Lyon", "Tallinn", "Porto", "Montreal", "Leeds"])},
     "The movers come on Friday; we are relocating to {city} for my partner's new post.",
     "Good luck with the move to {city}.",
     "Which city is {N} moving to?",
     "Where is {N} relocating for the partner's new post?"),
    ("book", lambda r: {"book": pick(r, ["The Remains of the Day", "Piranesi", "Station Eleven", "Klara and the Sun"])},
     "I could not put down {book}, best novel I have read in years.",
     "{book} is a favourite of many readers.",
     "What book did {N} enjoy recently?",
     "Which novel could {N} not put down?"),
    ("injury", lambda r: {"part": pick(r, ["knee", "ankle", "shoulder", "wrist"])},
     "The physio says my {part} should heal in six weeks if I stop running for now.",
     "Rest is the quickest way back, take it easy.",
     "What injury is {N} recovering from?",
     "What did the physio tell {N} to heal?"),
    ("school", lambda r: {"kid": pick(r, ["Maya", "Leo", "Noor", "Sami"]),
                          "school": pick(r, ["Hillcrest Primary", "Oakfield Elementary", "Riverside Academy"])},
     "Our daughter {kid} starts first grade at {school} in September.",
     "A big step for {kid}!",
     "Where will {N}'s child go to school?",
     "Which school does {N}'s daughter start first grade at?"),
    ("diet", lambda r: {},
     "I have been fully vegetarian since January and feel great about it.",
     "Plenty of good recipes fit that.",
     "Does {N} eat meat?",
     "Since when has {N} been vegetarian?"),
    ("birthday", lambda r: {"day": pick(r, ["March 3", "July 19", "November 27", "February 11"]),
                            "age": pick(r, ["thirty", "forty", "thirty-five"])},
     "My birthday is on {day}, I am turning {age} this year.",
     "Happy early birthday!",
     "When is {N}'s birthday?",
     "How old is {N} turning on their birthday?"),
    ("language", lambda r: {"lang": pick(r, ["Portuguese", "Japanese", "Korean", "Italian"])},
     "I have been studying {lang} on my commute, twenty minutes every day.",
     "Consistency like that pays off.",
     "Which language is {N} learning?",
     "What is {N} studying on the commute?"),
]

# Everyday topics: (user turn, assistant turn) pairs. Many share words with
# the questions above, as real chat logs do.
TOPICS = {
    "cooking": [("What can I cook with leftover rice?", "Fried rice or rice pudding both work well."),
                ("Which ingredient makes a curry creamy?", "Coconut milk or yoghurt."),
                ("Any quick meals for busy weeknights?", "Sheet-pan dinners and stir-fries are fast."),
                ("How long should pasta rest after cooking?", "Serve it right away; toss it with the sauce."),
                ("Is it safe to eat meat that was frozen twice?", "Usually, but texture suffers."),
                ("What goes well with roast vegetables?", "A lemony yoghurt dip.")],
    "travel": [("Which city has the best museums in Europe?", "Paris, Berlin and Madrid are strong picks."),
               ("How early should I get to the airport for a holiday flight?", "Two hours for international."),
               ("Are dog-friendly hotels common in Spain?", "Many chains accept small dogs."),
               ("What should go in a carry-on for a long flight?", "Chargers, a sweater, snacks, a pen."),
               ("Where is a good place for a weekend city break?", "Lisbon, Prague or Edinburgh."),
               ("Do I need a visa for a short holiday in Canada?", "Most visitors need an eTA.")],
    "code": [("How do I reverse a list in Python?", "Use reversed() or slicing with [::-1]."),
             ("What does a segmentation fault mean?", "The program touched memory it may not."),
             ("How do I name variables well?", "Say what the value means, not its type."),
             ("Can you explain recursion simply?", "A function solving a smaller copy of its problem."),
             ("Which language should I learn first for data work?", "Python, then SQL."),
             ("How do I drive a headless browser from a script?", "Playwright or Selenium.")],
    "money": [("How much should I save each month?", "Many aim for 20 percent of income."),
              ("Is it worth paying off a car loan early?", "If the rate is high, yes."),
              ("What do people usually do for a living in finance?", "Analysts, accountants, advisers."),
              ("How do I budget for a family holiday?", "Set a total, then split it by category."),
              ("Should I buy or lease a vehicle?", "Buying is cheaper over long periods."),
              ("What is an index fund?", "A fund that tracks a market index.")],
    "fitness": [("How often should I stretch?", "Daily, gently, after warming up."),
                ("What is a good beginner running plan?", "Couch to 5k is popular."),
                ("How do I avoid injury when lifting?", "Warm up and keep good form."),
                ("Is swimming good for recovering from an injury?", "Often, since it is low impact."),
                ("How much water should I drink while training?", "Sip regularly, by thirst."),
                ("Can weekends alone keep me fit?", "Two active days help, more is better.")],
    "home": [("How do I get rid of mould in the bathroom?", "Vinegar, ventilation, and time."),
             ("Which houseplants survive low light?", "Snake plants and pothos."),
             ("What is the best way to pack for moving?", "Label boxes by room, pack heavy items small."),
             ("How do I choose paint for a child's room?", "Washable, low-VOC paint."),
             ("Any tips for a tidy garage?", "Wall hooks and clear bins."),
             ("What should I check before signing a lease?", "Deposit terms, repairs, notice period.")],
    "media": [("Can you recommend a good book about habits?", "Atomic Habits is a common pick."),
              ("What film should I watch tonight?", "Something light: a comedy you have not seen."),
              ("Who wrote the Hobbit?", "J. R. R. Tolkien."),
              ("Is there a podcast about history you like?", "Try one on ancient Rome."),
              ("What music helps with focus?", "Instrumental or ambient tracks."),
              ("Which novel should my book club read next?", "Pick one with a strong discussion hook.")],
    "family": [("What are fun things to do with family on weekends?", "Picnics, museums, board games."),
               ("How do I help a child settle at a new school?", "Visit early and keep routines steady."),
               ("What is a thoughtful birthday gift for my mother?", "Something personal, like a photo book."),
               ("How can I keep in touch with relatives abroad?", "A regular video call slot works."),
               ("What school supplies does a first grader need?", "Pencils, crayons, a lunch box."),
               ("How do I plan a surprise birthday party?", "Pick a date, a host, a cover story.")],
}


def gen_user(rng, i):
    name = NAMES[i % len(NAMES)]
    start = datetime.date(2026, 1, 5)
    sessions = []
    topics = list(TOPICS)
    for s in range(20):
        topic = topics[(i + s) % len(topics)]
        pairs = TOPICS[topic][:]
        rng.shuffle(pairs)
        sessions.append({"date": (start + datetime.timedelta(days=9 * s)).isoformat(),
                         "turns": [t for p in pairs[:5] for t in (("user", p[0]), ("assistant", p[1]))]})
    qs = []
    facts = FACTS[:]
    rng.shuffle(facts)
    for j, (_, draw, said, reply, para, shared) in enumerate(facts):
        v = draw(rng)
        v["N"] = name
        s = 1 + (j * 19) // len(facts)  # spread over sessions 1..19
        pos = 2 * rng.randrange(1, 5)   # a user turn after the first exchange
        turns = sessions[s]["turns"]
        turns[pos:pos] = [("user", said.format(**v)), ("assistant", reply.format(**v))]
        qs.append((para.format(**v), "paraphrase", s, said.format(**v)))
        qs.append((shared.format(**v), "shared words", s, said.format(**v)))
    # Evidence: the index of the fact's turn in its session, after all inserts.
    questions = []
    for q, kind, s, said in qs:
        t = next(k for k, (r, x) in enumerate(sessions[s]["turns"]) if r == "user" and x == said)
        questions.append((q, kind, {(s, t)}))
    return name, sessions, questions


def search(mnt, scope, q, k, mode):
    with open(os.path.join(mnt, scope, ".search", query_name(q, f"k={k}&mode={mode}"))) as f:
        text = f.read()
    return [line.split("\t")[2] for line in text.splitlines() if line.strip()]


def turn_of(path):
    """(session, turn) from a node path ending in s{S}-t{T}."""
    s, t = path.rstrip("/").rsplit("/", 1)[-1].split("-")
    return int(s[1:]), int(t[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("CTXFS_BIN", "target/release/ctxfs"))
    ap.add_argument("--model-dir", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--embedder", default="minilm", choices=["minilm", "hash"],
                    help="hash: the hashing fallback (no model)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    rng = random.Random(11)
    users = [gen_user(rng, i) for i in range(args.users)]
    layouts = {
        "plain": lambda name, date, role, text: f"{name if role == 'user' else 'Assistant'}: {text}",
        "dated": lambda name, date, role, text: f"[{date}] {name if role == 'user' else 'Assistant'}: {text}",
    }
    tmp = tempfile.mkdtemp(prefix="ctxfs-eval-conv-", dir="/tmp")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cfg = os.path.join(tmp, "config.toml")
    with open(cfg, "w") as f:
        f.write("".join(f'[[account]]\nid = "{a}"\nwriters = [0]\n' for a in layouts))
    emb = ["--model-dir", os.path.abspath(args.model_dir)] if args.embedder == "minilm" else ["--embedder", "hash"]
    subprocess.run([args.bin, "mount", mnt, "--data", data, "--config", cfg] + emb, check=True)
    try:
        t0 = time.time()
        texts = {}
        for acct, fmt in layouts.items():
            for name, sessions, _ in users:
                u = name.lower()
                lines = []
                for s, sess in enumerate(sessions):
                    for t, (role, text) in enumerate(sess["turns"]):
                        body = fmt(name, sess["date"], role, text)
                        texts[(acct, u, s, t)] = body
                        lines.append(json.dumps({"node": f"users/{u}/memories/chat/s{s:02d}-t{t:02d}",
                                                 "content": body, "meta": {"status": "ACTIVE"}}))
                with open(os.path.join(mnt, "accounts", acct, ".ctxfs", "batch"), "w") as f:
                    f.write("\n".join(lines) + "\n")
        wait_sync(mnt)
        nodes = sum(1 for k in texts if k[0] == "plain")
        print(f"{args.users} users, {nodes} turns per layout, indexed in {time.time() - t0:.0f} s",
              file=sys.stderr)
        ks = (1, 3, 10)
        rankers = ("hybrid", "vector", "lexical", "bm25")
        kinds = ("all", "paraphrase", "shared words")
        hit = {(a, r, kd, k): 0 for a in layouts for r in rankers for kd in kinds for k in ks}
        nq = {kd: 0 for kd in kinds}
        lat = []
        for name, sessions, questions in users:
            u = name.lower()
            keys = [(s, t) for s, sess in enumerate(sessions) for t in range(len(sess["turns"]))]
            for q, kind, want in questions:
                nq["all"] += 1
                nq[kind] += 1
                for acct in layouts:
                    ranked = bm25_rank([texts[(acct, u, s, t)] for s, t in keys], q)
                    got = {"bm25": [keys[i] for i in ranked[:10]]}
                    for mode in ("hybrid", "vector", "lexical"):
                        t = time.perf_counter()
                        got[mode] = [turn_of(p) for p in search(mnt, f"accounts/{acct}/users/{u}", q, 10, mode)]
                        lat.append(time.perf_counter() - t)
                    for r in rankers:
                        for k in ks:
                            if any(x in want for x in got[r][:k]):
                                hit[(acct, r, "all", k)] += 1
                                hit[(acct, r, kind, k)] += 1
                    if args.verbose and acct == "plain" and not any(x in want for x in got["hybrid"]):
                        top = [texts[(acct, u) + x][:60] for x in got["hybrid"][:2]]
                        print(f"  missed ({kind}): {q} -> {top}", file=sys.stderr)
        lat.sort()
        print(f"\n{args.embedder}: {args.users} users, {nodes} turns and {nq['all']} questions per layout "
              f"({nq['paraphrase']} in other words, {nq['shared words']} sharing words with the evidence); "
              f"search p50 {lat[len(lat) // 2] * 1e3:.1f} ms through the mount")
        print("\n| layout | ranking | recall@1 | recall@3 | recall@10 | @10 vs BM25 | @10 other words | @10 shared words |")
        print("|---|---|---|---|---|---|---|---|")
        for acct in layouts:
            base = hit[(acct, "bm25", "all", 10)] / nq["all"]
            for r in rankers:
                r10 = hit[(acct, r, "all", 10)] / nq["all"]
                print(f"| {acct} | {r} | " + " | ".join(f"{hit[(acct, r, 'all', k)] / nq['all']:.3f}" for k in ks)
                      + f" | {(r10 / base - 1) * 100:+.0f} % | "
                      + " | ".join(f"{hit[(acct, r, kd, 10)] / nq[kd]:.3f}" for kd in kinds[1:]) + " |")
    finally:
        subprocess.run([args.bin, "umount", mnt])
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
