#!/usr/bin/env bash
# The quantized-checkpoint section of make bench (issue 28), runnable on
# its own: the Qwen3-0.6B shape with random weights as GGUF Q8_0 and
# Q4_K_M (made once under $BUILD/models by the model maker), BF16 beside
# them in the same run for the ratios, 2 threads. Each line is
# bench-engine's JSON; after it, quant_ratio.py prints redlm's figure, the
# ratio to llama.cpp's on this machine as issue 28 quotes them (commit
# 34af94cd, same shape and threads: decode Q8_0 41 tok/s, Q4_K_M 67 tok/s,
# prefill 512 Q4_K_M 265 tok/s) and, for decode, the share of the
# bandwidth roofline of the format's bytes per token. Where node is
# installed, llama.cpp itself is measured in the same run instead, on the
# same files and threads (tests/bench/llama: node-llama-cpp's prebuilt CPU
# build, pinned; npm ci there on first use; LLAMA=0 skips it), batch 16
# included, which the issue did not quote; LLAMA_B16_Q8_0 /
# LLAMA_B16_Q4_K_M (tok/s) still override. The peak memory of loading a
# Q4_K_M 14B is tests/bench/quant_rss.sh (~9 GB of disk and memory: not
# part of this run unless QUANT_RSS=1).
set -euo pipefail
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
cd "$(dirname "$0")/../.."
mkdir -p "$BUILD/models"
M06="$BUILD/models/qwen3-0.6b-bf16"
if [ ! -f "$M06/config.json" ]; then
    "$BUILD/redlm" mkmodel --shape qwen3-0.6b --dtype bf16 --out "$M06" >/dev/null
fi
# the GGUF files carry the Qwen3 tokenizer in their metadata, as Qwen's and
# Ollama's do: llama.cpp refuses a file without it
for q in q8_0 q4_k_m; do
    if [ ! -f "$BUILD/models/qwen3-0.6b-$q.tok.gguf" ]; then
        "$BUILD/redlm" mkmodel --shape qwen3-0.6b --dtype "$q" --tokenizer engine/tokenizers/qwen3 \
            --out "$BUILD/models/qwen3-0.6b-$q.tok.gguf" >/dev/null
    fi
done
ratio() { /usr/bin/python3 tests/bench/quant_ratio.py "$@"; }
bench() { "$BUILD/redlm" bench-engine --threads "$THREADS" "$@"; }
Q8="$BUILD/models/qwen3-0.6b-q8_0.tok.gguf"
Q4="$BUILD/models/qwen3-0.6b-q4_k_m.tok.gguf"

# llama.cpp on the same file: llama FILE BATCH PROMPT GEN FIELD -> tok/s, or
# the quoted figure (last argument) when it cannot run here
LL=tests/bench/llama
llama_ok=0
if [ "${LLAMA:-1}" != 0 ] && command -v node >/dev/null; then
    # the x64 CPU build is a dependency of its own; the other platforms' and
    # the GPU builds are optional ones, left out (npm install, not npm ci:
    # npm ci refuses a lock file that lacks other platforms' optional builds)
    [ -d "$LL/node_modules/node-llama-cpp" ] ||
        (cd "$LL" && npm install --no-audit --no-fund --loglevel=error --omit=optional) >/dev/null 2>&1
    [ -d "$LL/node_modules/node-llama-cpp" ] && llama_ok=1
fi
llama() {
    local file=$1 b=$2 p=$3 g=$4 field=$5 quoted=$6 line=""
    if [ "$llama_ok" = 1 ]; then
        line=$(cd "$LL" && node bench.mjs "$OLDPWD/$file" --threads "$THREADS" --batch "$b" --prompt "$p" --gen "$g" 2>/dev/null | grep '^{')
    fi
    if [ -n "$line" ]; then
        echo "# llama.cpp: $line" >&2
        /usr/bin/python3 -c 'import json,sys; print("%.1f" % json.loads(sys.argv[1])[sys.argv[2]])' "$line" "$field"
    else
        echo "$quoted"
    fi
}
LQ8_TG=$(llama "$Q8" 1 1 64 decode_tok_s 41)
LQ4_TG=$(llama "$Q4" 1 1 64 decode_tok_s 67)
LQ8_PP=$(llama "$Q8" 1 512 2 prefill_tok_s "")
LQ4_PP=$(llama "$Q4" 1 512 2 prefill_tok_s 265)
LQ8_B16=${LLAMA_B16_Q8_0:-$(llama "$Q8" 16 512 64 decode_tok_s "")}
LQ4_B16=${LLAMA_B16_Q4_K_M:-$(llama "$Q4" 16 512 64 decode_tok_s "")}
echo "# llama.cpp ($([ $llama_ok = 1 ] && echo "measured now, node-llama-cpp 3.22.1" || echo "quoted by issue 28")):" \
     "tg64 Q8_0 $LQ8_TG, Q4_K_M $LQ4_TG; pp512 Q8_0 ${LQ8_PP:-?}, Q4_K_M $LQ4_PP; b16 Q8_0 ${LQ8_B16:-?}, Q4_K_M ${LQ4_B16:-?} tok/s"

echo "# quantized decode b=1 (tg64: prompt 1, 64 tokens), BF16 / Q8_0 / Q4_K_M alternating, 2 rounds"
for round in 1 2; do
    bench -m "$M06" --prompt 1 --gen 64 --batch 1 | ratio --label "bf16 decode b=1" --field decode_tok_s --roofline
    bench -m "$Q8" --prompt 1 --gen 64 --batch 1 | ratio --label "q8_0 decode b=1" --field decode_tok_s --llama "$LQ8_TG" --target 60 --roofline
    bench -m "$Q4" --prompt 1 --gen 64 --batch 1 | ratio --label "q4_k_m decode b=1" --field decode_tok_s --llama "$LQ4_TG" --target 80 --roofline
done
echo "# quantized prefill 512 (and decode 64 after it) at batch 1"
bench -m "$M06" --prompt 512 --gen 64 --batch 1 | ratio --label "bf16 prefill 512" --field prefill_tok_s
bench -m "$Q8" --prompt 512 --gen 64 --batch 1 | ratio --label "q8_0 prefill 512" --field prefill_tok_s \
    ${LQ8_PP:+--llama "$LQ8_PP"} --target-ratio 1.5
bench -m "$Q4" --prompt 512 --gen 64 --batch 1 | ratio --label "q4_k_m prefill 512" --field prefill_tok_s --llama "$LQ4_PP" --target-ratio 1.5
echo "# quantized decode at batch 16 (prompt 512, 64 tokens each)"
bench -m "$M06" --prompt 512 --gen 64 --batch 16 | ratio --label "bf16 decode b=16" --field decode_tok_s
bench -m "$Q8" --prompt 512 --gen 64 --batch 16 | ratio --label "q8_0 decode b=16" --field decode_tok_s \
    ${LQ8_B16:+--llama "$LQ8_B16"} --target-ratio 2
bench -m "$Q4" --prompt 512 --gen 64 --batch 16 | ratio --label "q4_k_m decode b=16" --field decode_tok_s \
    ${LQ4_B16:+--llama "$LQ4_B16"} --target-ratio 2
if [ "${QUANT_RSS:-0}" = 1 ]; then
    BUILD="$BUILD" bash tests/bench/quant_rss.sh
fi
