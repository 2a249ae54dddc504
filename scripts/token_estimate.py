#!/usr/bin/env python3
"""How ctxfs's token estimate compares with a real tokenizer's count.

ctxfs estimates tokens the same everywhere (prompts fitted to the model's
context, search results packed to `?budget=N`, memory maps and headers to
a budget), and says the estimate is high: never fewer tokens than the
model reads. This script asks the model server's tokenizer (llama.cpp's
`/tokenize`, the default model as `scripts/llm-setup.sh` serves it) for
the real count of texts of every kind (chat, docs, code, JSON, times,
ids, hex, base64, several scripts) and prints the estimate's ratio to it.

The estimate below mirrors `schema::estimate_tokens` (src/schema/mod.rs);
its unit test pins the same texts' counts, so a change to one shows in
the other.

    python3 scripts/token_estimate.py [--url http://127.0.0.1:28080]
"""
import argparse
import json
import os
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def estimate(text):
    """schema::estimate_tokens: the larger of bytes / 3 and a count by kind
    of character (in twelfths of a token)."""
    n, i, L = 0, 0, len(text)
    space = " \t\r\n"
    while i < L:
        c = text[i]
        nx = text[i + 1] if i + 1 < L else ""
        if c.isascii() and c.isalpha():
            if nx.isascii() and nx.isalpha():
                n += 3 if c.islower() else 8
            elif nx != "" and nx in space and c.islower():
                n += 3
            else:
                n += 12
            i += 1
        elif c in space:
            j = i
            while j < L and text[j] in space:
                j += 1
            after = text[j] if j < L else ""
            n += 0 if (after.isascii() and after.isalpha()) else 12
            i = j
        else:
            n += 24 if ord(c) > 0xFFFF else 12
            i += 1
    return max(-(-len(text.encode()) // 3), -(-n // 12))


def texts():
    out = {
        "timestamps": " ".join(f"2023-10-{i:02d}T14:{i:02d}:00Z" for i in range(1, 29)),
        "numbers": " ".join(str(17 * i * i + 3) for i in range(200)),
        "UUIDs": " ".join(f"{i:08x}-1a2b-4c3d-9e8f-{i * 7919:012x}" for i in range(60)),
        "hex": "c5969f0d1a2b4c3d9e8f0123456789ab" * 20,
        "base64": "QmFzZTY0IGVuY29kZWQgdGV4dCBsb29rcyBsaWtlIHRoaXMgYW5kIGl0IGlzIGhhcmQ=" * 10,
        "log lines": "\n".join(f"2026-11-29 08:{i % 60:02d}:{i * 7 % 60:02d} INFO 10.0.{i % 256}.{i * 3 % 256} "
                               f"GET /api/v1/items/{i * 31} 200 {i * 13}ms" for i in range(60)),
        "node meta (JSON)": '{"status": "ACTIVE", "id": "c5969f0d-1a2b-4c3d-9e8f-0123456789ab", '
                            '"created_at": "2026-11-29T08:16:26.123456Z", "version": 12}' * 10,
        "packed search answer": "\n".join(
            f"## {i}. inbox/s{i}.json#{i * 3} (medium)\n#{i * 3} Dave (user) 2023-10-{i % 28 + 1:02d}"
            f"T14:{i % 60:02d}:00Z: I restored an old car with my dad that summer." for i in range(1, 30)),
        "English chat": ("Hey! Long time no talk. Last weekend my sister and I drove up to the lake, rented a "
                         "small boat and spent the whole afternoon fishing. We didn't catch much, but the sunset "
                         "was amazing. How was your week? Did you finish the painting you told me about?\n") * 10,
        "ALL CAPS": "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG AND RUNS AWAY " * 20,
        "camelCase code": "fn estimateTokensForHTTPRequest(parsedUrlComponents: Vec<UrlPart>) -> ResultType "
                          "{ unimplementedYet() }\n" * 20,
        "German compounds": "Die Donaudampfschifffahrtsgesellschaftskapitänsmütze liegt auf dem Tisch. " * 20,
        "French": "Nous avons décidé d'aller à la plage samedi prochain avec les enfants et leurs amis. " * 20,
        "Greek": "Σήμερα περπατήσαμε στο πάρκο και ο καιρός ήταν υπέροχος." * 20,
        "Cyrillic": "Сегодня мы гуляли в парке, погода была прекрасная." * 20,
        "Arabic": "ذهبنا إلى السوق صباح اليوم واشترينا الخضروات والفواكه الطازجة. " * 20,
        "Hindi": "आज हम बाज़ार गए और ताज़ी सब्ज़ियाँ और फल खरीदे। " * 20,
        "Chinese": "我们今天去公园散步，天气很好，看到了很多花。" * 20,
        "Japanese": "今日は公園を散歩しました。天気がとても良かったです。" * 20,
        "Korean": "오늘은 날씨가 좋아서 공원에서 산책을 했습니다. 친구들과 함께 점심을 먹었어요. " * 20,
        "emoji": "great day 🎉🎉 at the park 🌳🐕 so fun 😀" * 20,
    }
    for name, path in (("README.md", "README.md"), ("docs/SEMANTICS.md", "docs/SEMANTICS.md"),
                       ("src/core/search.rs", "src/core/search.rs"), ("Cargo.lock", "Cargo.lock")):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            out[name] = f.read()[:15000]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="the model server (default: scripts/llm-setup.sh start)")
    args = ap.parse_args()
    url = args.url or subprocess.run([os.path.join(HERE, "llm-setup.sh"), "start"], check=True,
                                     capture_output=True, text=True).stdout.strip()
    base = url.rstrip("/").removesuffix("/v1")

    def real(t):
        req = urllib.request.Request(base + "/tokenize", json.dumps({"content": t}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return len(json.load(r)["tokens"])

    rows = []
    for name, t in texts().items():
        n = real(t)
        rows.append((estimate(t) / n, name, len(t.encode()), n, estimate(t), -(-len(t.encode()) // 3) / n))
    print("| text | bytes | tokenizer | estimate | ÷ tokenizer | bytes / 3 ÷ tokenizer |")
    print("|---|---|---|---|---|---|")
    for ratio, name, b, n, e, third in sorted(rows):
        print(f"| {name} | {b:,} | {n:,} | {e:,} | {ratio:.2f} | {third:.2f} |")
    low = min(rows)
    print(f"\nlowest: {low[1]} {low[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
