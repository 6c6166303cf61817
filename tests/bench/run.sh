#!/usr/bin/env bash
# make bench: the benchmarks whose figures BENCHMARKS.md records.
# Makes the random-weight checkpoints it needs once (build/models/), then
# prints one JSON line per measurement. Threads default to 2, the size of
# the machines this project is measured on; override with THREADS=N.
set -euo pipefail
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
cd "$(dirname "$0")/../.."
mkdir -p "$BUILD/models"
M06="$BUILD/models/qwen3-0.6b-bf16"
if [ ! -f "$M06/config.json" ]; then
    "$BUILD/redlm" mkmodel --shape qwen3-0.6b --dtype bf16 --out "$M06" >/dev/null
fi
# the same shape with the real tokenizer: constraints need its vocabulary
M06T="$BUILD/models/qwen3-0.6b-bf16-tok"
if [ ! -f "$M06T/config.json" ]; then
    "$BUILD/redlm" mkmodel --shape qwen3-0.6b --dtype bf16 --tokenizer engine/tokenizers/qwen3 \
        --out "$M06T" >/dev/null
fi

echo "# kernels (memory bandwidth, BF16 peak, GEMM rates)"
"$BUILD/tests/bench_kernels" --threads "$THREADS"

echo "# engine core: decode from an empty context, as llama-bench's tg64 measures it"
"$BUILD/redlm" bench-engine -m "$M06" --prompt 1 --gen 64 --batch 1 --threads "$THREADS"
echo "# engine core: prefill 512 and decode 64 at batch 1, 4, 16 ($M06, $THREADS threads)"
for b in 1 4 16; do
    "$BUILD/redlm" bench-engine -m "$M06" --prompt 512 --gen 64 --batch "$b" --threads "$THREADS"
done

BUILD="$BUILD" THREADS="$THREADS" tests/bench/spec.sh

BUILD="$BUILD" THREADS="$THREADS" tests/bench/quant.sh

echo "# structured output (issue 17): free vs JSON-Schema-constrained decode, one engine, alternating;"
echo "# the Qwen3-0.6B shape with the real vocabulary ($M06T, $THREADS threads, prompt 32, output 16)"
for b in 1 16; do
    "$BUILD/redlm" bench-engine -m "$M06T" --json-schema tests/bench/data/long-array.json \
        --prompt 32 --gen 16 --batch "$b" --reps 3 --threads "$THREADS"
done

# a small model with the real vocabulary: steps of a few ms, as a GPU's are
MTV="$BUILD/models/tiny-256-vocab-tok"
if [ ! -f "$MTV/config.json" ]; then
    "$BUILD/redlm" mkmodel --shape tiny --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
        --head-dim 64 --layers 4 --vocab 151936 --dtype bf16 --tokenizer engine/tokenizers/qwen3 \
        --out "$MTV" >/dev/null
fi
if [ -x "$BUILD/tests/bench_compile" ]; then
    echo "# structured output: new schemas' compiles inside submit vs on 1 and 2 compile threads, as the"
    echo "# running requests see them ($MTV, batch 4, $THREADS threads, near-limit schemas: 1, then 4 at once)"
    for k in 1 4; do
        "$BUILD/tests/bench_compile" -m "$MTV" --batch 4 --constrained "$k" --compile-threads 2 \
            --reps 5 --threads "$THREADS"
    done
fi

echo "# structured output: plain jobs beside a burst of new schemas, through a worker of 4 slots"
/usr/bin/python3 tests/bench/bench_compile_slots.py --model "$MTV"

if [ -x "$BUILD/tests/bench_embed" ]; then
    echo "# embeddings: 16 documents of 128 tokens one at a time, together, and as 1-token"
    echo "# generations (the prefill an embedding costs); $M06, $THREADS threads, alternating"
    "$BUILD/tests/bench_embed" -m "$M06" --docs 16 --len 128 --reps 5 --threads "$THREADS"
fi
if [ -x "$BUILD/tests/bench_lora" ]; then
    echo "# LoRA adapters: decode at batch 8 on the base, on one rank-16 adapter, over four adapters"
    echo "# and the base; prefill 512 on the base and on an adapter ($M06, $THREADS threads, alternating)"
    "$BUILD/tests/bench_lora" -m "$M06" --rank 16 --adapters 4 --batch 8 --gen 32 --prompt 512 --reps 7 \
        --threads "$THREADS"
fi
echo "# embeddings end to end: 64 documents through the front door, Redis and a worker ($MTV):"
echo "# one request with a list, one request a document, 8 requests at a time"
/usr/bin/python3 tests/bench/bench_embed_front.py --model "$MTV" --rounds 7 --threads "$THREADS"
if [ -x "$BUILD/tests/bench_tokenizer" ]; then
    echo "# tokenizer encode speed, one core"
    "$BUILD/tests/bench_tokenizer" --tokenizer engine/tokenizers/qwen3
fi
if [ -x "$BUILD/tests/bench_grammar" ]; then
    echo "# structured output: grammar compile time and per-step token mask (real Qwen3 vocabulary, one core)"
    "$BUILD/tests/bench_grammar" --tokenizer engine/tokenizers/qwen3
fi
if [ -x "$BUILD/tests/bench_batching" ]; then
    echo "# continuous batching: prompt 128, output 128"
    "$BUILD/tests/bench_batching" -m "$M06" --threads "$THREADS"
fi

# --- CUDA host work per step (issue 25 point 4) ---
if [ -x "$BUILD/tests/bench_sample" ]; then
    echo "# host work per step for the sampled rows, batch 1/16/64: full rows vs 64-entry candidate sets"
    echo "# (the CPU backend's logits of $M06, then synthetic peaked rows)"
    "$BUILD/tests/bench_sample" -m "$M06" --threads "$THREADS"
    "$BUILD/tests/bench_sample"
fi

# --- dispatcher (branch disp) ---
echo "# dispatcher: requests routed per second (route, cache-miss and cache-hit mixes)"
/usr/bin/python3 tests/bench/bench_dispatcher.py --requests "${DISP_REQUESTS:-20000}"

# --- HTTP front door (branch http) ---
if [ -x "$BUILD/tests/bench_http" ] && command -v redis-server >/dev/null; then
    echo "# HTTP front door: token event XADD on redlm:out:<id> -> its SSE chunk at the client (no model)"
    rdir=$(mktemp -d)
    rport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$rport" --bind 127.0.0.1 --dir "$rdir" --save "" --appendonly no \
        --logfile "$rdir/redis.log" --daemonize yes --pidfile "$rdir/redis.pid"
    for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
    "$BUILD/tests/bench_http" --redis "127.0.0.1:$rport" --requests 500 --tokens 8 || true
    kill "$(cat "$rdir/redis.pid")" 2>/dev/null || true
    rm -rf "$rdir"
fi

# ---- the load benchmark of a deployment (redlm bench; tests/bench/bench_load.sh) ----
if command -v redis-server >/dev/null && [ -x "$BUILD/redlm-worker" ]; then
    echo "# load: redlm bench through a private redis-server, 1 vs 2 workers, result cache on vs off"
    BUILD="$BUILD" bash tests/bench/bench_load.sh
else
    echo "# load: skipped (needs redis-server and $BUILD/redlm-worker)"
fi

# ---- one Redis vs a 3-master Redis Cluster (issue 19; tests/bench/bench_cluster.py) ----
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null && [ -x "$BUILD/redlm-worker" ]; then
    echo "# cluster: 2 workers, redlm bench --target pool:fast at 8/32/96 clients, one redis-server vs 3 masters + 3 replicas"
    BUILD="$BUILD" /usr/bin/python3 tests/bench/bench_cluster.py --workers 2 --sweep 8,32,96 --requests 1000 --reps 3
else
    echo "# cluster: skipped (needs redis-server, redis-cli and $BUILD/redlm-worker)"
fi

# ---- what write fencing costs Redis per event (issue 19; tests/bench/bench_fence.py) ----
if command -v redis-server >/dev/null; then
    echo "# fencing: plain XADD vs FENCE_EMIT (1 job per call, as on a cluster; 64 per call, as on one instance)"
    /usr/bin/python3 tests/bench/bench_fence.py --reps 3
else
    echo "# fencing: skipped (needs redis-server)"
fi

# ---- what one read event costs Redis, against the command it carries (issue 27 point 4;
# tests/bench/read_event_cost.py): why the cluster's figures are read in read events ----
if command -v redis-server >/dev/null; then
    echo "# read events: Redis CPU a call, PING alone / pipelined, a plain look, the aged look"
    /usr/bin/python3 tests/bench/read_event_cost.py --calls "${READ_EVENT_CALLS:-20000}"
else
    echo "# read events: skipped (needs redis-server)"
fi

# ---- stored responses (tests/bench/bench_responses_store.py): the record's write on
# each response, and a conversation chained by previous_response_id against sent whole ----
if command -v redis-server >/dev/null; then
    echo "# stored responses: store on / off; chained / whole (the tiny model, 8 output tokens)"
    /usr/bin/python3 tests/bench/bench_responses_store.py
else
    echo "# stored responses: skipped (needs redis-server)"
fi
