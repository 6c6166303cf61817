#!/usr/bin/env python3
"""Reads bench-engine's JSON line on stdin, echoes it, and prints one line
more: redlm's figure for --field, its ratio to llama.cpp's (--llama, the
figure issue 28 quotes for this machine), the target it is held to, and
with --roofline the share of the decode roofline (bench-engine's
roofline_decode_tok_s: the format's weight bytes per token against the
measured read bandwidth). Used by tests/bench/quant.sh."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--field", required=True)
    ap.add_argument("--llama", type=float)
    ap.add_argument("--target", type=float, help="absolute tok/s the issue asks for")
    ap.add_argument("--target-ratio", type=float, help="ratio to llama.cpp the issue asks for")
    ap.add_argument("--roofline", action="store_true")
    a = ap.parse_args()
    rec = None
    for line in sys.stdin:
        sys.stdout.write(line)
        s = line.strip()
        if s.startswith("{") and a.field in s:
            rec = json.loads(s)
    if rec is None:
        print(json.dumps({"quant": a.label, "error": "no bench-engine result"}))
        return 1
    v = rec[a.field]
    out = {"quant": a.label, a.field: v}
    if a.llama:
        out["llama_cpp"] = a.llama
        out["ratio"] = round(v / a.llama, 2)
    elif a.target_ratio:
        out["llama_cpp"] = "not measured in this run"
    if a.target:
        out["target"] = a.target
        out["meets_target"] = v >= a.target
    if a.target_ratio:
        out["target_ratio"] = a.target_ratio
        if a.llama:
            out["meets_target"] = v / a.llama >= a.target_ratio
    if a.roofline and rec.get("roofline_decode_tok_s"):
        out["roofline_decode_tok_s"] = rec["roofline_decode_tok_s"]
        out["roofline_share"] = round(v / rec["roofline_decode_tok_s"], 3)
        out["weight_bytes_per_token"] = rec.get("weight_bytes_per_token")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
