#!/usr/bin/env bash
# The quantized-checkpoint section of make bench (issue 28), runnable on
# its own: the Qwen3-0.6B shape with random weights as GGUF Q8_0 and
# Q4_K_M (made once under $BUILD/models by the model maker), BF16 beside
# them in the same run for the ratios, 2 threads. Each line is
# bench-engine's JSON; after it, quant_ratio.py prints redlm's figure, the
# ratio to llama.cpp's on this machine as issue 28 quotes them (commit
# 34af94cd, same shape and threads: decode Q8_0 41 tok/s, Q4_K_M 67 tok/s,
# prefill 512 Q4_K_M 265 tok/s) and, for decode, the share of the
# bandwidth roofline of the format's bytes per token. llama.cpp's batch-16
# decode was not quoted: give it as LLAMA_B16_Q8_0 / LLAMA_B16_Q4_K_M
# (tok/s, e.g. from llama-batched-bench -npp 512 -ntg 64 -npl 16) for the
# ratio, else the line says it is missing. The peak memory of loading a
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
for q in q8_0 q4_k_m; do
    if [ ! -f "$BUILD/models/qwen3-0.6b-$q.gguf" ]; then
        "$BUILD/redlm" mkmodel --shape qwen3-0.6b --dtype "$q" --out "$BUILD/models/qwen3-0.6b-$q.gguf" >/dev/null
    fi
done
ratio() { /usr/bin/python3 tests/bench/quant_ratio.py "$@"; }
bench() { "$BUILD/redlm" bench-engine --threads "$THREADS" "$@"; }
Q8="$BUILD/models/qwen3-0.6b-q8_0.gguf"
Q4="$BUILD/models/qwen3-0.6b-q4_k_m.gguf"

echo "# quantized decode b=1 (tg64: prompt 1, 64 tokens), BF16 / Q8_0 / Q4_K_M alternating, 2 rounds"
for round in 1 2; do
    bench -m "$M06" --prompt 1 --gen 64 --batch 1 | ratio --label "bf16 decode b=1" --field decode_tok_s --roofline
    bench -m "$Q8" --prompt 1 --gen 64 --batch 1 | ratio --label "q8_0 decode b=1" --field decode_tok_s --llama 41 --target 60 --roofline
    bench -m "$Q4" --prompt 1 --gen 64 --batch 1 | ratio --label "q4_k_m decode b=1" --field decode_tok_s --llama 67 --target 80 --roofline
done
echo "# quantized prefill 512 (and decode 64 after it) at batch 1"
bench -m "$M06" --prompt 512 --gen 64 --batch 1 | ratio --label "bf16 prefill 512" --field prefill_tok_s
bench -m "$Q8" --prompt 512 --gen 64 --batch 1 | ratio --label "q8_0 prefill 512" --field prefill_tok_s
bench -m "$Q4" --prompt 512 --gen 64 --batch 1 | ratio --label "q4_k_m prefill 512" --field prefill_tok_s --llama 265 --target-ratio 1.5
echo "# quantized decode at batch 16 (prompt 512, 64 tokens each)"
bench -m "$M06" --prompt 512 --gen 64 --batch 16 | ratio --label "bf16 decode b=16" --field decode_tok_s
bench -m "$Q8" --prompt 512 --gen 64 --batch 16 | ratio --label "q8_0 decode b=16" --field decode_tok_s \
    ${LLAMA_B16_Q8_0:+--llama "$LLAMA_B16_Q8_0"} --target-ratio 2
bench -m "$Q4" --prompt 512 --gen 64 --batch 16 | ratio --label "q4_k_m decode b=16" --field decode_tok_s \
    ${LLAMA_B16_Q4_K_M:+--llama "$LLAMA_B16_Q4_K_M"} --target-ratio 2
if [ "${QUANT_RSS:-0}" = 1 ]; then
    BUILD="$BUILD" bash tests/bench/quant_rss.sh
fi
