#!/usr/bin/env bash
# The load benchmark of a whole deployment, `redlm bench` against a private
# redis-server on a free loopback port, workers on a small random-weight
# Qwen3 with the real vocabulary (as examples/demo.sh makes it) and, when
# build/ has one, the dispatcher. Four measurements in one run, so that the
# ratios between them are measured on the same (shared, noisy) machine:
#
#   one-worker   1 worker,  closed-loop sweep over $SWEEP clients
#   two-workers  2 workers, the same sweep
#   cache-on     2 workers, $CACHE_CLIENTS clients, half the requests repeat
#                one of 4 greedy prompts: the result cache answers them
#   cache-off    the same with the workers started with --no-result-cache
#
# Every run writes build/bench-load/<name>/result.json, latency.png and
# throughput.png; a table and the ratios go to stdout. One thread per
# worker (--threads 1): this machine has 2 cores. Bounded: $DURATION
# seconds (or $REQUESTS requests) per level.
#   DURATION=10 SWEEP=1,2,4,8 bash tests/bench/bench_load.sh
set -euo pipefail
BUILD=${BUILD:-build}
SHARED=${REDLM_SHARED:-../shared}
DURATION=${DURATION:-10}
REQUESTS=${REQUESTS:-400}
SWEEP=${SWEEP:-1,2,4,8}
CACHE_CLIENTS=${CACHE_CLIENTS:-4}
cd "$(dirname "$0")/../.."
OUT="$PWD/$BUILD/bench-load" # absolute: redis-server changes into its --dir
model="$BUILD/models/bench-load-qwen3"
if [ ! -f "$model/config.json" ]; then
    "$BUILD/redlm" mkmodel --shape tiny --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
        --head-dim 64 --vocab 151936 --dtype bf16 --tokenizer "$SHARED/tokenizer/qwen3" \
        --out "$model" >/dev/null
fi
rm -rf "$OUT"
mkdir -p "$OUT/logs"

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
addr="127.0.0.1:$port"
prefix="bench:"
pids=()    # redis-server and the dispatcher
workers=() # the workers now running
cleanup() {
    for p in "${workers[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${workers[@]}" "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT/logs" \
    --logfile "$OUT/logs/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$port" ping >/dev/null || { echo "redis-server did not start" >&2; exit 1; }

start_workers() { # $1 = count, then extra worker flags
    local n=$1
    shift
    for i in $(seq "$n"); do
        "$BUILD/redlm-worker" --redis "$addr" --prefix "$prefix" --model "$model" --pools fast,think \
            --name "w$i" --threads 1 --http-port 0 "$@" >"$OUT/logs/worker-w$i.log" 2>&1 &
        workers+=($!)
    done
    for i in $(seq "$n"); do
        until grep -q "ready:" "$OUT/logs/worker-w$i.log"; do
            kill -0 "${workers[$((i - 1))]}" 2>/dev/null || { cat "$OUT/logs/worker-w$i.log"; exit 1; }
            sleep 0.1
        done
    done
}
stop_workers() {
    for p in "${workers[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${workers[@]}"; do wait "$p" 2>/dev/null || true; done
    workers=()
    redis-cli -p "$port" --scan --pattern "${prefix}worker:*" | xargs -r redis-cli -p "$port" del >/dev/null
}

# the dispatcher, when this build has one and it comes up; else the
# benchmark routes by mode itself (think -> jobs:think, others -> jobs:fast)
target=pools
if [ -x "$BUILD/redlm-dispatcher" ]; then
    "$BUILD/redlm-dispatcher" --redis "$addr" --prefix "$prefix" --name d1 --pools fast,think \
        >"$OUT/logs/dispatcher.log" 2>&1 &
    disp_pid=$!
    pids+=("$disp_pid")
    for _ in $(seq 50); do
        [ -n "$(redis-cli -p "$port" --scan --pattern "${prefix}dispatcher:*")" ] && { target=dispatcher; break; }
        sleep 0.1
    done
    if [ "$target" != dispatcher ]; then
        echo "# the dispatcher did not come up (see $OUT/logs/dispatcher.log); sending to the pools"
        kill "$disp_pid" 2>/dev/null || true
    fi
fi

common=(--redis "$addr" --prefix "$prefix" --target "$target" --prompt-len 16..64 --output-len 16..64
        --think 0.25 --duration "$DURATION" --requests "$REQUESTS" --timeout 300)
run() { # $1 = name, then extra bench flags
    local name=$1
    shift
    echo "# $name: redlm bench ${common[*]} $* --label $name --out $OUT/$name/result.json" >&2
    "$BUILD/redlm" bench "${common[@]}" "$@" --label "$name" --out "$OUT/$name/result.json" >/dev/null
}

start_workers 1
run one-worker --sweep "$SWEEP" --seed 1
stop_workers
start_workers 2
run two-workers --sweep "$SWEEP" --seed 1
run cache-on --clients "$CACHE_CLIENTS" --repeat 0.5 --hot 4 --seed 2
stop_workers
start_workers 2 --no-result-cache
run cache-off --clients "$CACHE_CLIENTS" --repeat 0.5 --hot 4 --seed 2
stop_workers

/usr/bin/python3 - "$OUT" "$target" <<'EOF'
import json, sys
out, target = sys.argv[1], sys.argv[2]
res = {n: json.load(open(f"{out}/{n}/result.json"))
       for n in ("one-worker", "two-workers", "cache-on", "cache-off")}
print(f"# redlm bench, target {target}; results and plots under {out}/<run>/")
hdr = ("run", "clients", "req/s", "tok/s", "ttft p50", "tpot p50", "e2e p50", "e2e p99", "cached", "errors")
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for name, r in res.items():
    for lv in r["levels"]:
        print(f"| {name} | {lv['level']:g} | {lv['requests_per_s']:.2f} | {lv['output_tokens_per_s']:.1f} | "
              f"{lv['ttft_ms']['p50']:.0f} ms | {lv['tpot_ms']['p50']:.1f} ms | {lv['e2e_ms']['p50']:.0f} ms | "
              f"{lv['e2e_ms']['p99']:.0f} ms | {100 * lv['cached_fraction']:.0f}% | {lv['n_errors']} |")
print()
one = {lv["level"]: lv for lv in res["one-worker"]["levels"]}
two = {lv["level"]: lv for lv in res["two-workers"]["levels"]}
ratios = ", ".join(f"{k:g} clients {two[k]['output_tokens_per_s'] / one[k]['output_tokens_per_s']:.2f}x"
                   for k in sorted(one) if k in two and one[k]["output_tokens_per_s"] > 0)
print(f"two workers / one worker, output tokens/s: {ratios}")
on, off = res["cache-on"]["levels"][0], res["cache-off"]["levels"][0]
if off["requests_per_s"] > 0 and on["e2e_ms"]["p50"] > 0:
    print(f"result cache on / off: requests/s {on['requests_per_s'] / off['requests_per_s']:.2f}x, "
          f"e2e p50 {on['e2e_ms']['p50']:.0f} vs {off['e2e_ms']['p50']:.0f} ms, "
          f"cached {100 * on['cached_fraction']:.0f}% vs {100 * off['cached_fraction']:.0f}%")
EOF

# one figure comparing the two sweeps (each run's own plots are in its folder)
if command -v gnuplot >/dev/null; then
    gnuplot <<GP
set terminal pngcairo size 1200,480 font ',10'
set output '$OUT/compare.png'
set multiplot layout 1,2 title 'redlm bench: one worker against two (--threads 1 each, closed loop)'
set grid
set key top left box opaque
set logscale x 2
set offsets graph 0.05, graph 0.05, 0, 0
set xlabel 'concurrent clients'
set ylabel 'output tokens/s'
set yrange [0:*]
set title 'throughput'
plot '$OUT/one-worker/load.dat' u 1:12 w lp lw 2 t '1 worker', '$OUT/two-workers/load.dat' u 1:12 w lp lw 2 t '2 workers'
set ylabel 'latency (ms)'
set title 'end-to-end latency'
plot '$OUT/one-worker/load.dat' u 1:5 w lp lw 2 t '1 worker p50', '' u 1:7 w lp dt 2 t '1 worker p99', \
     '$OUT/two-workers/load.dat' u 1:5 w lp lw 2 t '2 workers p50', '' u 1:7 w lp dt 2 t '2 workers p99'
unset multiplot
GP
    echo "comparison plot: $OUT/compare.png"
fi
