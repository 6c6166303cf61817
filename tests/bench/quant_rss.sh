#!/usr/bin/env bash
# Peak resident memory of loading a Q4_K_M checkpoint of the Qwen3-14B shape
# on the CPU backend (issue 28: <= 10 GB). Makes the model once under
# $TMPDIR (~9 GB of disk; SHAPE=qwen3-1.7b for a quick check of the
# script), loads it with `redlm logits` on a 3-token prompt (the load plus
# one forward), reads the process's peak RSS (VmHWM, through GNU time) and
# deletes the file. Needs about 10 GB of free memory: run it on a quiet
# machine. Prints one JSON line.
set -euo pipefail
BUILD=${BUILD:-build}
SHAPE=${SHAPE:-qwen3-14b}
LIMIT_GB=${LIMIT_GB:-10}
cd "$(dirname "$0")/../.."
dir=$(mktemp -d "${TMPDIR:-/tmp}/redlm-rss-XXXXXX")
trap 'rm -rf "$dir"' EXIT
f="$dir/$SHAPE-q4_k_m.gguf"
"$BUILD/redlm" mkmodel --shape "$SHAPE" --dtype q4_k_m --pattern --out "$f" >/dev/null
size=$(stat -c %s "$f")
/usr/bin/time -f "%M" -o "$dir/rss" "$BUILD/redlm" logits -m "$f" --tokens 1,2,3 --threads "${THREADS:-2}" >/dev/null
rss_kb=$(tail -1 "$dir/rss")
/usr/bin/python3 -c "
import json, sys
rss = $rss_kb * 1024 / 1e9; size = $size / 1e9
print(json.dumps({'rss_peak': '$SHAPE q4_k_m load + 3-token forward, cpu backend', 'file_gb': round(size, 2),
                  'vmhwm_gb': round(rss, 2), 'limit_gb': $LIMIT_GB, 'ok': rss <= $LIMIT_GB}))
"
