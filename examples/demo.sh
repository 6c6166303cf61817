#!/usr/bin/env bash
# The demo `make demo` runs: makes a small random-weight Qwen3 checkpoint
# with the real Qwen3 tokenizer, renders a chat prompt with the official
# template, samples through the batching engine on the CPU backend and prints the text.
# (Random weights: the words are nonsense, the pipeline is the real one.)
set -euo pipefail
BUILD=${BUILD:-build}
SHARED=${REDLM_SHARED:-../shared}
cd "$(dirname "$0")/.."
model="$BUILD/models/demo-qwen3"
if [ ! -f "$model/config.json" ]; then
    echo "making a random Qwen3 checkpoint (hidden 256, 4 layers, real vocabulary) in $model"
    "$BUILD/redlm" mkmodel --shape tiny --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
        --head-dim 64 --vocab 151936 --dtype bf16 --tokenizer "$SHARED/tokenizer/qwen3" --out "$model" >/dev/null
fi
msgs=$(mktemp) prompt_file=$(mktemp) jobs=$(mktemp)
trap 'rm -f "$msgs" "$prompt_file" "$jobs"' EXIT
printf '[{"role": "user", "content": "%s"}]' "${1:-Tell me about Redis streams.}" >"$msgs"
# the prompt goes through a file: $(...) would drop its trailing newlines
"$BUILD/redlm" template --tokenizer "$model" --messages "$msgs" --no-think >"$prompt_file"
printf -- '--- prompt (Qwen3 chat template, thinking off) ---\n'; cat "$prompt_file"
ids=$("$BUILD/redlm" tokenize --tokenizer "$model" --file "$prompt_file" | sed 's/.*\[\(.*\)\].*/\1/; s/ //g')
echo "--- $(echo "$ids" | tr ',' '\n' | wc -l) prompt tokens; sampling 24 tokens (temperature 0.8, seed 7) ---"
printf '{"prompt_ids": [%s], "max_tokens": 24, "temperature": 0.8, "seed": 7, "ignore_eos": true}\n' "$ids" >"$jobs"
out=$("$BUILD/redlm" run -m "$model" --batch "$jobs")
gen=$(echo "$out" | sed 's/.*"tokens": *\[\([^]]*\)\].*/\1/; s/ //g')
echo "token ids: $gen"
"$BUILD/redlm" detokenize --tokenizer "$model" --ids "$gen"
