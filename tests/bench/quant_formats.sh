#!/usr/bin/env bash
# Every GGUF block format redlm reads, on the Qwen3-0.6B shape with random
# weights (one file per llama.cpp mix, made by the model maker with the
# Qwen3 tokenizer in its metadata so that llama.cpp loads it too), 2
# threads: redlm's decode tg64 (prompt 1, 64 tokens) and prefill 512, and
# where node is installed llama.cpp's on the same file right before it
# (tests/bench/llama: node-llama-cpp's pinned prebuilt CPU build; LLAMA=0
# skips it). Pairs back to back, ROUNDS rounds: on a shared machine only
# side-by-side figures mean much. One line per format, shape and round, and
# the read-bandwidth probe (before / after) of each redlm run.
#   FORMATS="q4_k_m q4_0 iq4_xs" ROUNDS=1 bash tests/bench/quant_formats.sh
set -euo pipefail
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
FORMATS=${FORMATS:-q8_0 q6_k q5_k_m q5_0 q5_1 q4_k_m q4_0 q4_1 iq4_nl iq4_xs q3_k_m q2_k}
cd "$(dirname "$0")/../.."
mkdir -p "$BUILD/models"
for q in $FORMATS; do
    f=$BUILD/models/qwen3-0.6b-$q.tok.gguf
    [ -f "$f" ] || "$BUILD/redlm" mkmodel --shape qwen3-0.6b --dtype "$q" --tokenizer engine/tokenizers/qwen3 \
        --out "$f" >/dev/null
done
LL=tests/bench/llama
llama_ok=0
if [ "${LLAMA:-1}" != 0 ] && command -v node >/dev/null; then
    [ -d "$LL/node_modules/node-llama-cpp" ] ||
        (cd "$LL" && npm install --no-audit --no-fund --loglevel=error --omit=optional) >/dev/null 2>&1 || true
    [ -d "$LL/node_modules/node-llama-cpp" ] && llama_ok=1
fi
ll() {
    [ "$llama_ok" = 1 ] || { echo "-"; return; }
    (cd "$LL" && node bench.mjs "$OLDPWD/$1" --threads "$THREADS" --batch 1 --prompt "$2" --gen "$3" 2>/dev/null |
        grep '^{' | /usr/bin/python3 -c "import json,sys; print('%.1f' % json.loads(sys.stdin.read())['$4'])") ||
        echo "failed"
}
rl() {
    "$BUILD/redlm" bench-engine --threads "$THREADS" -m "$1" --prompt "$2" --gen "$3" --batch 1 2>/dev/null |
        /usr/bin/python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('%.1f probe %s' % (d['$4'], d['mem_read_gb_s_before_after']))"
}
for r in $(seq "$ROUNDS"); do
    for q in $FORMATS; do
        f=$BUILD/models/qwen3-0.6b-$q.tok.gguf
        mb=$(( $(stat -c %s "$f") / 1000000 ))
        echo "round $r $q (${mb} MB) tg64 llama.cpp $(ll "$f" 1 64 decode_tok_s) redlm $(rl "$f" 1 64 decode_tok_s) load $(cut -d' ' -f1 /proc/loadavg)"
        echo "round $r $q (${mb} MB) pp512 llama.cpp $(ll "$f" 512 2 prefill_tok_s) redlm $(rl "$f" 512 2 prefill_tok_s) load $(cut -d' ' -f1 /proc/loadavg)"
    done
done
