#!/usr/bin/env python3
"""A canned chat-completions server for the error cases of memory extraction
(the real model runs in the other tests): it answers POST requests with the
replies of a script, in order, the last one repeated.

    canned-llm.py SCRIPT.json PORTFILE

SCRIPT.json is a list of replies: {"status": 200, "content": "...",
"usage": {...}, "delay": seconds, "raw": "body as is"}. The port it listens
on (127.0.0.1, chosen by the kernel) is written to PORTFILE; every request
body is appended to PORTFILE.requests (one JSON per line).
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


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(portfile + ".tmp", portfile)
srv.serve_forever()
