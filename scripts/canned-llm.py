#!/usr/bin/env python3
"""A canned chat-completions server for the error cases of memory extraction
(the real model runs in the other tests): it answers POST requests with the
replies of a script, in order, the last one repeated.

    canned-llm.py SCRIPT.json PORTFILE

SCRIPT.json is a list of replies: {"status": 200, "content": "...",
"usage": {...}, "delay": seconds, "raw": "body as is"}, or, streamed as
server-sent events when the request asks for a stream, {"chunks": ["...",
...], "chunk_delay": seconds}. The port it listens on (127.0.0.1, chosen by
the kernel) is written to PORTFILE; every request body is appended to
PORTFILE.requests (one JSON per line), and for a streamed reply how many of
its chunks were written before the client closed the connection to
PORTFILE.streamed ("SENT of TOTAL", one line per reply).
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

script = json.load(open(sys.argv[1]))
portfile = sys.argv[2]
n = 0


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        global n
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(portfile + ".requests", "a") as f:
            f.write(body.decode() + "\n")
        r = script[min(n, len(script) - 1)]
        n += 1
        time.sleep(r.get("delay", 0))
        if "chunks" in r and json.loads(body).get("stream"):
            self.stream(r)
            return
        if "raw" in r:
            out = r["raw"].encode()
        else:
            out = json.dumps({
                "choices": [{"message": {"role": "assistant", "content": r.get("content", "")}}],
                "usage": r.get("usage", {"prompt_tokens": 10, "completion_tokens": 5}),
            }).encode()
        try:
            self.send_response(r.get("status", 200))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def stream(self, r):
        chunks = r["chunks"]
        events = [{"choices": [{"delta": {"content": c}}]} for c in chunks]
        events.append({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": len(chunks)}})
        sent = 0
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for e in events:
                self.wfile.write(b"data: " + json.dumps(e).encode() + b"\n\n")
                self.wfile.flush()
                sent += 1
                time.sleep(r.get("chunk_delay", 0))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        with open(portfile + ".streamed", "a") as f:
            f.write(f"{min(sent, len(chunks))} of {len(chunks)}\n")


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(portfile + ".tmp", portfile)
srv.serve_forever()
