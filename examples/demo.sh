#!/usr/bin/env bash
# The demo `make demo` runs: makes a small random-weight Qwen3 checkpoint
# with the real Qwen3 tokenizer, renders a chat prompt with the official
# template, generates greedily on the CPU backend and prints the text.
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
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
printf '[{"role": "user", "content": "%s"}]' "${1:-Tell me about Redis streams.}" >"$msgs"
prompt=$("$BUILD/redlm" template --tokenizer "$model" --messages "$msgs" --no-think)
printf -- '--- prompt (Qwen3 chat template, thinking off) ---\n%s\n' "$prompt"
ids=$("$BUILD/redlm" tokenize --tokenizer "$model" --text "$prompt" | sed 's/.*\[\(.*\)\].*/\1/; s/ //g')
echo "--- $(echo "$ids" | tr ',' '\n' | wc -l) prompt tokens; generating 24 tokens greedily ---"
out=$("$BUILD/redlm" run -m "$model" --tokens "$ids" -n 24 --temperature 0 --ignore-eos)
gen=$(echo "$out" | sed 's/.*\[\(.*\)\].*/\1/; s/ //g')
echo "token ids: $gen"
"$BUILD/redlm" detokenize --tokenizer "$model" --ids "$gen"
