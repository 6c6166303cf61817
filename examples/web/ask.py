#!/usr/bin/python3
"""Sends one chat message to the example web backend and prints the answer
as it streams: the smallest client of POST /api/chat, used by the demo's
smoke mode (examples/demo.sh --smoke).

    /usr/bin/python3 examples/web/ask.py http://127.0.0.1:8080/ "Hello" [--think] [--max-tokens N]

Reasoning (thinking mode) goes to stderr, the answer to stdout. Exit status
0 when the request ends with done, 1 on an error event or a broken stream,
2 when the backend refuses the request.
"""
import argparse
import http.client
import json
import sys
import urllib.parse


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the backend's base URL")
    p.add_argument("message")
    p.add_argument("--think", action="store_true", help="thinking mode")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--timeout", type=float, default=300, help="seconds (default %(default)s)")
    o = p.parse_args(argv)
    u = urllib.parse.urlsplit(o.url)
    body = {"messages": [{"role": "user", "content": o.message}], "think": o.think}
    if o.max_tokens is not None:
        body["max_tokens"] = o.max_tokens
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=o.timeout)
    conn.request("POST", "/api/chat", json.dumps(body), {"Content-Type": "application/json"})
    res = conn.getresponse()
    if res.status != 200:
        print(f"ask: HTTP {res.status}: {res.read().decode(errors='replace')}", file=sys.stderr)
        return 2
    event, data = None, []
    while True:
        line = res.readline()  # events arrive one by one: print each as it comes
        if not line:
            print("\nask: the stream ended before done", file=sys.stderr)
            return 1
        line = line.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            ev = json.loads("\n".join(data))
            data = []
            if event == "job":
                print(f"[job {ev['id']}]", file=sys.stderr, flush=True)
            elif event == "delta":
                if ev["delta"].get("reasoning_content"):
                    sys.stderr.write(ev["delta"]["reasoning_content"])
                    sys.stderr.flush()
                if ev["delta"].get("content"):
                    sys.stdout.write(ev["delta"]["content"])
                    sys.stdout.flush()
            elif event == "error":
                print(f"\nask: {ev.get('code')}: {ev.get('message')}", file=sys.stderr)
                return 1
            elif event == "done":
                u = ev.get("usage", {})
                print(f"\n[done: {ev['finish_reason']}, {u.get('completion_tokens')} tokens]",
                      file=sys.stderr)
                return 0 if ev["finish_reason"] != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
