#!/usr/bin/env bash
# The load benchmark of a whole deployment: `redlm bench` against a private
# redis-server on a free loopback port, workers on a small random-weight
# Qwen3 with the real vocabulary (as examples/demo.sh makes it), one thread
# each (this machine has 2 cores), and, when build/ has one, a dispatcher
# per deployment. Deployments live side by side under their own key
# prefixes (an idle worker costs no CPU: it waits in XREADGROUP), so the
# two configurations of a comparison take turns, A B B A, each for half of
# $DURATION: on a shared, noisy machine the load drifts over minutes, and
# the turns cancel a steady drift out of the ratios.
#
#   one-worker/c<N>/r1,r2   1 worker,  N closed-loop clients  } in turns,
#   two-workers/c<N>/r1,r2  2 workers, N closed-loop clients  } N in $SWEEP
#   open-loop               2 workers, Poisson arrivals, a sweep over $RATES req/s
#   cache-on/r1,r2          2 workers, $CACHE_CLIENTS clients, half the requests
#                           repeat one of 4 greedy prompts: the cache answers } in
#   cache-off/r1,r2         the same on 2 workers with --no-result-cache, and } turns
#                           a dispatcher without the cache fast path
#
# Every run writes build/bench-load/<run>/result.json, latency.png and
# throughput.png; build/bench-load/compare.png puts one worker against two;
# a table (the two turns of a configuration pooled, bench_load_report.py)
# and the ratios go to stdout. Bounded: $DURATION seconds (or
# $REQUESTS requests) per level.
#   DURATION=10 SWEEP=1,2,4,8 RATES=1,2,4 bash tests/bench/bench_load.sh
set -euo pipefail
BUILD=${BUILD:-build}
DURATION=${DURATION:-10}
REQUESTS=${REQUESTS:-400}
SWEEP=${SWEEP:-1,2,4,8}
RATES=${RATES:-1,2,4}
CACHE_CLIENTS=${CACHE_CLIENTS:-4}
cd "$(dirname "$0")/../.."
OUT="$PWD/$BUILD/bench-load" # absolute: redis-server changes into its --dir
model="$BUILD/models/bench-load-qwen3"
if [ ! -f "$model/config.json" ]; then
    "$BUILD/redlm" mkmodel --shape tiny --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
        --head-dim 64 --vocab 151936 --dtype bf16 --tokenizer engine/tokenizers/qwen3 \
        --out "$model" >/dev/null
fi
rm -rf "$OUT"
mkdir -p "$OUT/logs"

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
addr="127.0.0.1:$port"
pids=() # every process started here; stopped by pid, never by name
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
trap cleanup EXIT

start_redis() {
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT/logs" \
        --logfile "$OUT/logs/redis.log" &
    pids+=($!)
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
    echo "redis-server did not start" >&2
    exit 1
}

declare -A target # prefix -> dispatcher | pools
deploy() { # $1 = prefix, $2 = number of workers, then extra worker flags
    local prefix=$1 n=$2 i log
    shift 2
    for i in $(seq "$n"); do
        log="$OUT/logs/${prefix%:}-w$i.log"
        "$BUILD/redlm-worker" --redis "$addr" --prefix "$prefix" --model "$model" --pools fast,think \
            --name "w$i" --threads 1 --kv-budget-mb 256 --http-port 0 "$@" >"$log" 2>&1 &
        pids+=($!)
        local pid=$! t=0
        until grep -q "ready:" "$log"; do
            kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
            t=$((t + 1))
            [ "$t" -lt 600 ] || { echo "worker $prefix w$i did not get ready" >&2; exit 1; }
            sleep 0.1
        done
    done
    target[$prefix]=pools # the benchmark routes by mode: think -> jobs:think, others -> jobs:fast
    if [ -x "$BUILD/redlm-dispatcher" ]; then
        local cache=(--model "$model") # its tokenizer, for the result-cache fast path
        case " $* " in *" --no-result-cache "*) cache=() ;; esac
        log="$OUT/logs/${prefix%:}-dispatcher.log"
        "$BUILD/redlm-dispatcher" --redis "$addr" --prefix "$prefix" --name d1 --pools fast,think \
            --http-port 0 "${cache[@]}" >"$log" 2>&1 &
        pids+=($!)
        for _ in $(seq 50); do
            if [ -n "$(redis-cli -p "$port" --scan --pattern "${prefix}dispatcher:*")" ]; then
                target[$prefix]=dispatcher
                break
            fi
            sleep 0.1
        done
        [ "${target[$prefix]}" = dispatcher ] ||
            echo "# $prefix the dispatcher did not come up (see $log); sending to the pools" >&2
    fi
}

common=(--redis "$addr" --prompt-len 16..64 --output-len 16..64 --think 0.25
        --duration "$DURATION" --requests "$REQUESTS" --timeout 300)
run() { # $1 = run name, $2 = prefix, then extra bench flags
    local name=$1 prefix=$2
    shift 2
    local args=("${common[@]}" --prefix "$prefix" --target "${target[$prefix]}" "$@"
                --label "$name" --out "$OUT/$name/result.json")
    echo "# $name: redlm bench ${args[*]}" >&2
    "$BUILD/redlm" bench "${args[@]}" >/dev/null
}

half=(--duration "$(awk "BEGIN { print $DURATION / 2 }")" --requests $(((REQUESTS + 1) / 2)))
turns() { # $1 = name A, $2 = prefix A, $3 = name B, $4 = prefix B, then bench flags: A B B A
    local a=$1 pa=$2 b=$3 pb=$4
    shift 4
    run "$a/r1" "$pa" "$@" "${half[@]}"
    run "$b/r1" "$pb" "$@" "${half[@]}"
    run "$b/r2" "$pb" "$@" "${half[@]}"
    run "$a/r2" "$pa" "$@" "${half[@]}"
}

start_redis
deploy one: 1
deploy two: 2
for n in ${SWEEP//,/ }; do
    turns "one-worker/c$n" one: "two-workers/c$n" two: --clients "$n" --seed 1
done
run open-loop two: --rate 1 --sweep "$RATES" --clients 64 --seed 3
cleanup
start_redis
deploy con: 2
deploy coff: 2 --no-result-cache
# cache-on's second turn finds the hot prompts cached by its first: the
# steady state of a deployment whose cache has warmed up
turns cache-on con: cache-off coff: --clients "$CACHE_CLIENTS" --repeat 0.5 --hot 4 --seed 2
cleanup

/usr/bin/python3 tests/bench/bench_load_report.py "$OUT" "$SWEEP" "${target[two:]}"

if command -v gnuplot >/dev/null; then
    gnuplot <<GP
set terminal pngcairo size 1200,480 font ',10'
set output '$OUT/compare.png'
set multiplot layout 1,2 title 'redlm bench: one worker against two (--threads 1 each, closed loop, in turns A B B A)'
set grid
set key top left box opaque
set logscale x 2
set offsets graph 0.05, graph 0.05, graph 0.2, 0
set xlabel 'concurrent clients'
set ylabel 'output tokens/s'
set yrange [0:*]
set title 'throughput'
plot '$OUT/compare.dat' u 1:2 w lp lw 2 t '1 worker', '' u 1:3 w lp lw 2 t '2 workers'
set ylabel 'end-to-end latency (ms)'
set title 'end-to-end latency'
plot '$OUT/compare.dat' u 1:4 w lp lw 2 t '1 worker p50', '' u 1:5 w lp dt 2 t '1 worker p99', \
     '' u 1:6 w lp lw 2 t '2 workers p50', '' u 1:7 w lp dt 2 t '2 workers p99'
unset multiplot
GP
    echo "comparison plot: $OUT/compare.png"
fi
