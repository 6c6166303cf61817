#!/usr/bin/env bash
# The load benchmark of a whole deployment: `redlm bench` against a private
# redis-server on a free loopback port, workers on a small random-weight
# Qwen3 with the real vocabulary (as examples/demo.sh makes it), one thread
# each (this machine has 2 cores), and, when build/ has one, a dispatcher
# per deployment. Deployments live side by side under their own key
# prefixes (an idle worker costs no CPU: it waits in XREADGROUP), so the
# configurations compared can take turns level by level: on a shared, noisy
# machine the load drifts over minutes, and interleaving keeps that drift
# out of the ratios.
#
#   one-worker/c<N>  1 worker,  N closed-loop clients     } in turns, for
#   two-workers/c<N> 2 workers, N closed-loop clients     } N in $SWEEP
#   open-loop        2 workers, Poisson arrivals, a sweep over $RATES req/s
#   cache-on         2 workers, $CACHE_CLIENTS clients, half the requests
#                    repeat one of 4 greedy prompts: the result cache answers
#   cache-off        the same on 2 workers started with --no-result-cache
#                    (and a dispatcher without the cache fast path)
#
# Every run writes build/bench-load/<run>/result.json, latency.png and
# throughput.png; build/bench-load/compare.png puts one worker against two;
# a table and the ratios go to stdout. Bounded: $DURATION seconds (or
# $REQUESTS requests) per level.
#   DURATION=10 SWEEP=1,2,4,8 RATES=1,2,4 bash tests/bench/bench_load.sh
set -euo pipefail
BUILD=${BUILD:-build}
SHARED=${REDLM_SHARED:-../shared}
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
        --head-dim 64 --vocab 151936 --dtype bf16 --tokenizer "$SHARED/tokenizer/qwen3" \
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

start_redis
deploy one: 1
deploy two: 2
for n in ${SWEEP//,/ }; do # taking turns, level by level
    run "one-worker/c$n" one: --clients "$n" --seed 1
    run "two-workers/c$n" two: --clients "$n" --seed 1
done
run open-loop two: --rate 1 --sweep "$RATES" --clients 64 --seed 3
cleanup
start_redis
deploy con: 2
deploy coff: 2 --no-result-cache
run cache-on con: --clients "$CACHE_CLIENTS" --repeat 0.5 --hot 4 --seed 2
run cache-off coff: --clients "$CACHE_CLIENTS" --repeat 0.5 --hot 4 --seed 2
cleanup

/usr/bin/python3 - "$OUT" "$SWEEP" "${target[two:]}" <<'EOF'
import json, sys
out, sweep, tgt = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
def level(path):
    return json.load(open(f"{out}/{path}/result.json"))["levels"]
rows = [(f"one-worker", lv) for n in sweep for lv in level(f"one-worker/c{n}")]
rows += [(f"two-workers", lv) for n in sweep for lv in level(f"two-workers/c{n}")]
rows += [("open-loop", lv) for lv in level("open-loop")]
rows += [(n, lv) for n in ("cache-on", "cache-off") for lv in level(n)]
print(f"# redlm bench, target {tgt}; results and plots under {out}/<run>/")
hdr = ("run", "load", "req/s", "tok/s", "ttft p50", "tpot p50", "e2e p50", "e2e p99", "cached", "errors")
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for name, lv in rows:
    load = f"{lv['level']:g} req/s" if lv["loop"] == "open" else f"{lv['level']:g} clients"
    print(f"| {name} | {load} | {lv['requests_per_s']:.2f} | {lv['output_tokens_per_s']:.1f} | "
          f"{lv['ttft_ms']['p50']:.0f} ms | {lv['tpot_ms']['p50']:.1f} ms | {lv['e2e_ms']['p50']:.0f} ms | "
          f"{lv['e2e_ms']['p99']:.0f} ms | {100 * lv['cached_fraction']:.0f}% | {lv['n_errors']} |")
print()
with open(f"{out}/compare.dat", "w") as f:
    f.write("# clients one_tok_s two_tok_s one_e2e_p50 one_e2e_p99 two_e2e_p50 two_e2e_p99\n")
    ratios = []
    for n in sweep:
        (a,), (b,) = level(f"one-worker/c{n}"), level(f"two-workers/c{n}")
        f.write(f"{n} {a['output_tokens_per_s']:.3f} {b['output_tokens_per_s']:.3f} {a['e2e_ms']['p50']:.3f} "
                f"{a['e2e_ms']['p99']:.3f} {b['e2e_ms']['p50']:.3f} {b['e2e_ms']['p99']:.3f}\n")
        if a["output_tokens_per_s"] > 0:
            ratios.append(f"{n} clients {b['output_tokens_per_s'] / a['output_tokens_per_s']:.2f}x")
print("two workers / one worker, output tokens/s: " + ", ".join(ratios))
(on,), (off,) = level("cache-on"), level("cache-off")
if off["requests_per_s"] > 0:
    print(f"result cache on / off: requests/s {on['requests_per_s'] / off['requests_per_s']:.2f}x, "
          f"e2e p50 {on['e2e_ms']['p50']:.0f} vs {off['e2e_ms']['p50']:.0f} ms, "
          f"cached {100 * on['cached_fraction']:.0f}% vs {100 * off['cached_fraction']:.0f}%")
EOF

if command -v gnuplot >/dev/null; then
    gnuplot <<GP
set terminal pngcairo size 1200,480 font ',10'
set output '$OUT/compare.png'
set multiplot layout 1,2 title 'redlm bench: one worker against two (--threads 1 each, closed loop, levels in turns)'
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
