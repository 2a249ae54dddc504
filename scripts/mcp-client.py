#!/usr/bin/env python3
"""A real MCP client session against `ctxfs mcp`, with the official Python SDK.

    mcp-client.py --bin CTXFS --mount MNT [--scope DIR] STEPS.json
    mcp-client.py ... --transcript STEPS.json

STEPS.json is a list of steps, run in one session after `initialize`:
  {"tools": true}                       list the tools (their names)
  {"tool": NAME, "args": {...}}         call a tool
  {"resource": URI}                     read a resource
  {"resources": true}                   list the resources (their URIs)

Without --transcript: one JSON line per step on stdout:
  {"step": N, "error": bool, "text": ..., "structured": ...}
With --transcript: the session as a reader would follow it (calls and
answers, times shown as <time>), for docs/AGENTS.md.

Runs as whoever starts it (tests use setpriv): the server it spawns runs as
the same uid, so the mount decides what the session may do. Needs the `mcp`
package (make deps puts it in /var/tmp/ctxfs-py; PYTHONPATH points there).
"""

import argparse
import json
import re
import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def run(args, steps):
    params = StdioServerParameters(
        command=args.bin,
        args=["mcp", "--mount", args.mount] + (["--scope", args.scope] if args.scope else []),
    )
    out = []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            if args.transcript:
                print(f"# server {init.server_info.name}, protocol {init.protocol_version}")
            for i, step in enumerate(steps):
                if step.get("tools"):
                    tools = await session.list_tools()
                    names = [t.name for t in tools.tools]
                    rec = {"step": i, "error": False, "text": " ".join(names), "structured": names}
                    shown = "list_tools()"
                elif step.get("resources"):
                    res = await session.list_resources()
                    uris = [str(r.uri) for r in res.resources]
                    rec = {"step": i, "error": False, "text": " ".join(uris), "structured": uris}
                    shown = "list_resources()"
                elif "resource" in step:
                    try:
                        res = await session.read_resource(step["resource"])
                        text = "".join(getattr(c, "text", "") for c in res.contents)
                        rec = {"step": i, "error": False, "text": text, "structured": None}
                    except Exception as e:  # an MCP error answer
                        rec = {"step": i, "error": True, "text": str(e), "structured": None}
                    shown = f"read_resource({step['resource']!r})"
                else:
                    result = await session.call_tool(step["tool"], step.get("args", {}))
                    rec = {
                        "step": i,
                        "error": bool(result.is_error),
                        "text": text_of(result),
                        "structured": result.structured_content,
                    }
                    shown = f"call_tool({step['tool']!r}, {json.dumps(step.get('args', {}))})"
                out.append(rec)
                if args.transcript:
                    print(f"> {shown}")
                    body = rec["text"]
                    if rec["structured"] is not None and not rec["error"] and "resource" not in step:
                        shown_value = rec["structured"]
                        if step.get("tool") == "search":
                            # The parts an agent acts on (timings and raw scores vary).
                            keep = ("rank", "uri", "abstract", "confidence", "lines")
                            shown_value = {
                                "signal": shown_value.get("signal"),
                                "results": [{k: r.get(k) for k in keep} for r in shown_value.get("results", [])],
                            }
                        body = json.dumps(shown_value, sort_keys=True)
                    body = TIME.sub("<time>", body).rstrip("\n")
                    tag = "error" if rec["error"] else "ok"
                    print(f"< {tag}: " + body.replace("\n", "\n  "))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mount", required=True)
    ap.add_argument("--scope")
    ap.add_argument("--transcript", action="store_true")
    ap.add_argument("steps")
    args = ap.parse_args()
    with open(args.steps) as f:
        steps = json.load(f)
    out = anyio.run(run, args, steps)
    if not args.transcript:
        for rec in out:
            print(json.dumps(rec))


if __name__ == "__main__":
    sys.exit(main())
