#!/usr/bin/env bash
# llama.cpp and redlm back to back on the same GGUF files (the 0.6B shape,
# Q8_0 and Q4_K_M, made by quant.sh), 2 threads, ROUNDS times: decode tg64
# (prompt 1, 64 tokens) and prefill 512, one line per format, shape and
# round with both engines' tok/s, redlm's bandwidth probe before / after and
# the load. On a shared machine the load moves within a minute; quant.sh
# measures all of llama.cpp first, so its ratios can compare two different
# machines; these pairs (and the best of each over the rounds) do not.
# Needs node and tests/bench/llama's node-llama-cpp (quant.sh installs it).
set -euo pipefail
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
cd "$(dirname "$0")/../.."
LL=tests/bench/llama
ll() {
    (cd "$LL" && node bench.mjs "$OLDPWD/$1" --threads "$THREADS" --batch 1 --prompt "$2" --gen "$3" 2>/dev/null |
        grep '^{' | /usr/bin/python3 -c "import json,sys; print('%.2f' % json.loads(sys.stdin.read())['$4'])")
}
rl() {
    "$BUILD/redlm" bench-engine --threads "$THREADS" -m "$1" --prompt "$2" --gen "$3" --batch 1 2>/dev/null |
        /usr/bin/python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('%.2f probe %s' % (d['$4'], d['mem_read_gb_s_before_after']))"
}
for r in $(seq "$ROUNDS"); do
    for q in q8_0 q4_k_m; do
        f=$BUILD/models/qwen3-0.6b-$q.tok.gguf
        echo "round $r $q tg64 llama.cpp $(ll "$f" 1 64 decode_tok_s) redlm $(rl "$f" 1 64 decode_tok_s) load $(cut -d' ' -f1 /proc/loadavg)"
        echo "round $r $q pp512 llama.cpp $(ll "$f" 512 2 prefill_tok_s) redlm $(rl "$f" 512 2 prefill_tok_s) load $(cut -d' ' -f1 /proc/loadavg)"
    done
done
