#!/usr/bin/env bash
# gpu_check.sh - the one command a GPU session runs (issue 25), from the
# folder `make gpu-bundle` made (tests/gpu/bundle.sh copies this file there):
#
#   bash gpu-bundle/gpu_check.sh
#
# Never compiles: the programs were built and stripped on the build machine
# and travel with their non-CUDA libraries in lib/; LD_LIBRARY_PATH is set
# for our own programs only (never for nvidia-smi or python3). Steps, each
# with its own time limit, so one hang cannot eat the machine's 15 minutes:
#
#   device      nvidia-smi: which GPU, driver
#   backend     test_backend_ops: every CUDA op against a CPU reference, the
#               tiny model against reference.json, BF16/FP8/quantized models
#               against the CPU backend
#   run-tiny    `redlm run` greedy on the tiny F32 model: CUDA tokens equal
#               to the CPU backend's, token for token
#   batch-tiny  `redlm run --batch`: 12 jobs of different prompts through the
#               batching engine on CUDA and on CPU, tokens equal
#   worker      redis-server + `redlm-worker --backend $BE --lora a=...`: 8 jobs, an embedding job
#               and a job for the LoRA adapter (its tokens not the base's) enqueued,
#               every stream ends in done, seq gapless from 0
#   batch-0.6b  a random BF16 Qwen3-0.6B made here by `redlm mkmodel`, 40 jobs
#               greedy on CUDA and CPU, 40 decoding at once: the agreed prefix
#               per job (BF16 rounding differs between the backends and random
#               weights give near-ties, so free runs part; passes when 3 in 4
#               agree on the first token), then teacher-forced: the top token of
#               6 prompts' last logits equal wherever the CPU margin is > 0.1
#   bench       bench_cuda on Qwen3-14B shapes (the time left but 90 s)
#   quant       Qwen3-1.7B random checkpoints in BF16, GGUF Q8_0 and Q4_K_M made
#               here, decode at batch 1 and 16 through the engine on CUDA
#   cluster     not the GPU: this machine's CPUs (12 or more) measure a 3-master
#               Redis Cluster against one redis-server, each on a core of its
#               own, with sim workers (issue 27 point 4; tests/bench/bench_fleet.py
#               --own-cores --alternate). Off unless CLUSTER_S (its seconds) is
#               set; then it runs last and the bench step leaves it that time.
#               GPU_CHECK_ONLY=cluster runs it alone (a second call while the
#               machine is warm, so the GPU steps keep their whole budget). On
#               fewer cores it only checks that the script and wrappers load.
#
# Results: $OUT (or gpu-bundle/logs) gets one log per step and summary.json
# ({"steps": [{"name", "status", "seconds", "detail"}], ...}), rewritten
# after every step so a killed run still leaves what it found. Status is
# passed, failed, skipped (with the reason) or no-device. On a machine with
# no CUDA device every step still runs its program, which must answer
# "no CUDA device": `.ci/run` does this dry run, so the bundle cannot rot.
# Exit status: 0 when nothing failed.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LOGS=${OUT:-$HERE/logs}
mkdir -p "$LOGS"
BUDGET_S=${BUDGET_S:-470}
# the cluster step's share of the budget (0: not run); on 12 cores or more
# (CLUSTER_FORCE=1: on any, a dry run whose figures mean nothing)
NCPU=$(nproc 2>/dev/null || echo 1)
ONLY=${GPU_CHECK_ONLY:-}
CLUSTER_S=${CLUSTER_S:-0}
[ "$ONLY" = cluster ] && [ "$CLUSTER_S" = 0 ] && CLUSTER_S=$(( BUDGET_S - 10 ))
T0=$(date +%s)
CUDA_LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && CUDA_LIBS="$CUDA_LIBS:$d"
done
ours() { LD_LIBRARY_PATH="$HERE/lib$CUDA_LIBS" "$@"; }
BIN=$HERE/bin
TINY=$HERE/data/models/tiny-qwen3-a
PY=$(command -v python3 || true)
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
# GPU_CHECK_BACKEND=cpu runs the steps' logic with the CPU backend in the
# CUDA's place: the script's own self-test on a machine without a GPU.
BE=${GPU_CHECK_BACKEND:-cuda}
REDIS_PID="" WORKER_PID=""
cleanup() {
    [ -n "$WORKER_PID" ] && kill "$WORKER_PID" 2>/dev/null
    [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
STEPS=""
record() { # name status seconds detail
    local d=${4//\\/\\\\}
    d=${d//\"/\\\"}
    STEPS="$STEPS${STEPS:+,}{\"name\": \"$1\", \"status\": \"$2\", \"seconds\": $3, \"detail\": \"$d\"}"
    printf '%-11s %-9s %4ss  %s\n' "$1" "$2" "$3" "$4"
    printf '{"commit": "%s", "device": "%s", "elapsed_s": %s, "steps": [%s]}\n' \
        "$(cat "$HERE/commit" 2>/dev/null)" "${DEVICE_NAME:-none}" "$(elapsed)" "$STEPS" > "$LOGS/summary.json"
}
nodev() { grep -qi 'no CUDA device' "$1"; }

echo "== gpu_check ($(cat "$HERE/commit" 2>/dev/null)), logs in $LOGS, budget ${BUDGET_S}s"

# --- a Redis Cluster against one instance, on this machine's cores (no GPU)
cluster_step() {
    local s t rc m c st
    s=$(date +%s)
    # the soak with the bundle's programs first on its PATH (the wrappers give
    # them its libraries) and the bundle's Python client; python3 is the machine's
    local -a FLEET_ENV=(env "PATH=$HERE/wrap:$PATH" "PYTHONPATH=$HERE/py.zip")
    local -a FLEET=("$PY" "$HERE/tests/bench/bench_fleet.py" --build wrap --tokenizer "$WORK/qwen3")
    : > "$LOGS/cluster.log"
    if ! "${FLEET_ENV[@]}" "${FLEET[@]}" --help >> "$LOGS/cluster.log" 2>&1 ||
            ! "$PY" -S -c 'import sys; sys.path.insert(0, sys.argv[1]); import redis, redis.cluster' \
                "$HERE/py.zip" >> "$LOGS/cluster.log" 2>&1 ||
            ! "$HERE/wrap/redis-server" --version >> "$LOGS/cluster.log" 2>&1 ||
            ! "$HERE/wrap/redlm-dispatcher" --help >> "$LOGS/cluster.log" 2>&1; then
        record cluster failed $(( $(date +%s) - s )) "the soak or a wrapper does not start: $(tail -3 "$LOGS/cluster.log" | tr '\n' ' ' | head -c 300)"
    elif [ "$CLUSTER_S" = 0 ]; then
        record cluster skipped $(( $(date +%s) - s )) "not asked (CLUSTER_S=0); bench_fleet.py and the wrappers load"
    elif { [ "$NCPU" -lt 12 ] && [ "${CLUSTER_FORCE:-0}" != 1 ]; } || [ "$(left)" -lt 100 ]; then
        record cluster skipped $(( $(date +%s) - s )) "bench_fleet.py and the wrappers load; the measurement needs 12 cores and 100 s ($NCPU cores, $(left) s left)"
    else
        mkdir -p "$WORK/qwen3"
        cp "$HERE/data/qwen3-tokenizer/tokenizer_config.json" "$WORK/qwen3/"
        "$PY" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$HERE/data/qwen3-tokenizer/tokenizer.json.gz" "$WORK/qwen3/tokenizer.json" 2>> "$LOGS/cluster.log"
        t=$(left)
        [ "$t" -gt "$CLUSTER_S" ] && t=$CLUSTER_S
        # sim workers serving Qwen3-1.7B (short steps: many tokens a worker, so
        # that 16 of them can load three cores of Redis); three cluster
        # sweeps between four of one instance. SIGTERM at the limit, to the
        # soak alone: it stops every process it started; SIGKILL 30 s on
        "${FLEET_ENV[@]}" timeout --foreground -k 30 "$t" "${FLEET[@]}" --out "$LOGS/cluster" \
            --cluster --against-single --single-replica --pin --own-cores --alternate 3 \
            --workers "${CLUSTER_WORKERS:-16}" --model qwen3-1.7b --rates "${CLUSTER_RATE:-2500}" \
            --clients "${CLUSTER_CLIENTS:-1024}" --duration 8 --coalesce-ms 0 >> "$LOGS/cluster.log" 2>&1
        rc=$?
        m=$(grep -m1 '^measured' "$LOGS/cluster.log" | head -c 300)
        c=$(grep -m2 '^check' "$LOGS/cluster.log" | tr '\n' ' ' | head -c 300)
        if [ "$rc" = 0 ] && [ -n "$m" ]; then st=passed; else st=failed; fi
        record cluster "$st" $(( $(date +%s) - s )) "rc $rc; ${m:-no ratio}; $c"
        [ -f "$LOGS/cluster/alternate.json" ] && cp "$LOGS/cluster/alternate.json" "$LOGS/cluster-alternate.json"
    fi
}

finish() { # exit status 0 when no step failed
    echo "== done in $(elapsed)s"
    grep -q '"status": "failed"' "$LOGS/summary.json" && exit 1
    exit 0
}

# --- device
s=$(date +%s)
if nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
        > "$LOGS/device.txt" 2>&1 && [ -s "$LOGS/device.txt" ]; then
    DEVICE_NAME=$(head -1 "$LOGS/device.txt" | cut -d, -f1)
    HAVE_GPU=1
    record device passed $(( $(date +%s) - s )) "$(head -1 "$LOGS/device.txt")"
elif [ "$BE" = cpu ]; then
    DEVICE_NAME=none HAVE_GPU=1
    record device passed 0 "self-test: the CPU backend stands in for CUDA"
else
    DEVICE_NAME=none
    HAVE_GPU=0
    record device no-device $(( $(date +%s) - s )) "no CUDA device (nvidia-smi: $(head -c 120 "$LOGS/device.txt" | tr '\n' ' '))"
fi

if [ "$ONLY" = cluster ]; then
    cluster_step
    finish
fi

# --- backend op tests
s=$(date +%s)
ours timeout 200 "$BIN/test_backend_ops" > "$LOGS/backend.log" 2>&1
rc=$?
p=$(grep -c '^\[       OK \]' "$LOGS/backend.log")
# cmocka names a failed or skipped test twice (as it runs, and in the summary)
f=$(grep '^\[  FAILED  \] test' "$LOGS/backend.log" | sort -u | wc -l)
k=$(grep '^\[  SKIPPED \] test' "$LOGS/backend.log" | sort -u | wc -l)
detail="$p passed, $f failed, $k skipped (rc $rc)"
if [ "$HAVE_GPU" = 0 ] && [ "$rc" = 0 ] && [ "$p" = 0 ] && [ "$f" = 0 ] && [ "$k" -gt 0 ]; then st=no-device
elif [ "$rc" = 0 ] && [ "$f" = 0 ] && [ "$k" = 0 ] && [ "$p" -gt 0 ]; then st=passed
elif [ "$rc" = 0 ] && [ "$f" = 0 ]; then st=skipped
else st=failed; fi
[ "$st" = failed ] && detail="$detail; $(grep -m3 -A2 'FAILED\|ERROR\|error' "$LOGS/backend.log" | tr '\n' ' ' | head -c 400)"
record backend "$st" $(( $(date +%s) - s )) "$detail"

# --- tiny model, greedy, CUDA against CPU
s=$(date +%s)
toks=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(",".join(map(str, r["prompts"][0]["ids"])))' \
       "$TINY/reference.json" 2>/dev/null || echo 1,2,3,4)
ours timeout 60 "$BIN/redlm" run -m "$TINY" --tokens "$toks" -n 48 --ignore-eos --backend cpu \
    > "$LOGS/run-tiny-cpu.log" 2>&1
ours timeout 60 "$BIN/redlm" run -m "$TINY" --tokens "$toks" -n 48 --ignore-eos --backend $BE \
    > "$LOGS/run-tiny-cuda.log" 2>&1
rc=$?
a=$(grep -m1 '"tokens"' "$LOGS/run-tiny-cpu.log")
b=$(grep -m1 '"tokens"' "$LOGS/run-tiny-cuda.log")
if [ "$HAVE_GPU" = 0 ] && nodev "$LOGS/run-tiny-cuda.log"; then st=no-device detail="redlm run: no CUDA device"
elif [ "$rc" = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then st=passed detail="48 greedy tokens equal"
else st=failed detail="rc $rc; cpu ${a:0:120} cuda ${b:0:120} $(tail -2 "$LOGS/run-tiny-cuda.log" | tr '\n' ' ')"; fi
record run-tiny "$st" $(( $(date +%s) - s )) "$detail"

# --- batching engine: 12 prompts at once, CUDA against CPU
batch_compare() { # name model n_jobs max_tokens timeout strict max_batch
    local name=$1 model=$2 n=$3 mt=$4 to=$5 strict=$6 mb=$7 s rc
    s=$(date +%s)
    "$PY" - "$n" "$mt" > "$WORK/$name.jsonl" <<'EOF'
import random, sys
n, mt = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(7)
for i in range(n):
    ids = [rng.randrange(16, 500) for _ in range(rng.randrange(3, 40 + 30 * (i % 12)))]
    print('{"prompt_ids": %s, "max_tokens": %d, "temperature": 0, "ignore_eos": true}' % (ids, mt))
EOF
    ours timeout "$to" "$BIN/redlm" run -m "$model" --batch "$WORK/$name.jsonl" --backend cpu \
        > "$LOGS/$name-cpu.jsonl" 2> "$LOGS/$name-cpu.err"
    ours timeout "$to" "$BIN/redlm" run -m "$model" --batch "$WORK/$name.jsonl" --backend $BE --max-batch "$mb" \
        > "$LOGS/$name-cuda.jsonl" 2> "$LOGS/$name-cuda.err"
    rc=$?
    if [ "$HAVE_GPU" = 0 ] && nodev "$LOGS/$name-cuda.err"; then
        record "$name" no-device $(( $(date +%s) - s )) "redlm run --batch: no CUDA device"
        return
    fi
    detail=$("$PY" - "$LOGS/$name-cpu.jsonl" "$LOGS/$name-cuda.jsonl" "$strict" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
b = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
if not a or len(a) != len(b):
    print("FAIL %d cpu lines, %d cuda lines" % (len(a), len(b))); sys.exit()
pre = []
for x, y in zip(a, b):
    tx, ty = x.get("tokens", []), y.get("tokens", [])
    k = 0
    while k < min(len(tx), len(ty)) and tx[k] == ty[k]:
        k += 1
    pre.append(k if tx != ty else len(tx))
full = sum(1 for x, y in zip(a, b) if x.get("tokens") == y.get("tokens") and x.get("tokens"))
ok = full == len(a) if sys.argv[3] == "1" else sum(1 for p in pre if p > 0) >= 0.75 * len(pre)
print("%s %d/%d jobs equal; agreed prefix per job %s" % ("OK" if ok else "FAIL", full, len(a), pre))
EOF
)
    if [ "$rc" = 0 ] && [ "${detail:0:2}" = OK ]; then st=passed; else st=failed; fi
    record "$name" "$st" $(( $(date +%s) - s )) "rc $rc; ${detail#* }"
}
batch_compare batch-tiny "$TINY" 12 40 90 1 16

# --- the worker on CUDA, through a real Redis
s=$(date +%s)
port=${GPU_CHECK_REDIS_PORT:-6399}
# Started as plain commands (not through the `ours` function, whose
# subshell $! would name): a kill must reach the server and the worker
# themselves - a worker left running holds the device's memory (its KV pool
# takes what the weights leave) and every later step fails to allocate.
LD_LIBRARY_PATH="$HERE/lib$CUDA_LIBS" "$BIN/redis-server" --port $port --bind 127.0.0.1 --save '' \
    --appendonly no > "$LOGS/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 50); do ours "$BIN/redis-cli" -p $port ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
LD_LIBRARY_PATH="$HERE/lib$CUDA_LIBS" "$BIN/redlm-worker" --redis 127.0.0.1:$port --model "$TINY" \
    --backend $BE --pools fast --http-port 0 --name gpu0 --lora "a=$HERE/data/lora-a" > "$LOGS/worker.log" 2>&1 &
WORKER_PID=$!
st="" detail=""
# the worker is up when its heartbeat key exists (or it has exited)
for _ in $(seq 300); do
    kill -0 $WORKER_PID 2>/dev/null || break
    [ -n "$(ours "$BIN/redis-cli" -p $port --scan --pattern 'redlm:worker:*' 2>/dev/null | head -1)" ] && break
    sleep 0.1
done
if ! kill -0 $WORKER_PID 2>/dev/null; then
    if [ "$HAVE_GPU" = 0 ] && nodev "$LOGS/worker.log"; then st=no-device detail="redlm-worker --backend cuda: no CUDA device"
    else st=failed detail="worker exited: $(tail -3 "$LOGS/worker.log" | tr '\n' ' ')"; fi
else
    ids=""
    for i in $(seq 8); do
        id=$(ours "$BIN/redlm" enqueue --redis 127.0.0.1:$port --pool fast --prompt-ids "$((i * 7)),$((i + 40)),99,100" \
             --max-tokens $((16 + i * 8)) --ignore-eos --temperature 0 2>>"$LOGS/worker-client.log")
        ids="$ids $id"
    done
    bad=0 ntok=0
    for id in $ids; do
        ours timeout 60 "$BIN/redlm" tail "$id" --json --timeout 30 --redis 127.0.0.1:$port \
            > "$WORK/ev.jsonl" 2>>"$LOGS/worker-client.log"
        cat "$WORK/ev.jsonl" >> "$LOGS/worker-events.jsonl"
        r=$("$PY" - "$WORK/ev.jsonl" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
seqs = [int(e["seq"]) for e in ev if "seq" in e]
done = bool(ev) and ev[-1].get("type") == "done"
ntok = sum(len(e.get("tokens", [])) if isinstance(e.get("tokens"), list) else 0 for e in ev)
ok = done and seqs == list(range(len(seqs)))
print(("ok" if ok else "bad"), len(ev))
EOF
)
        [ "${r%% *}" = ok ] || bad=$((bad + 1))
        ntok=$((ntok + ${r##* }))
    done
    # an embedding job: the CUDA backend's hidden state (be_ops.hidden),
    # one done event with a unit vector of the model's hidden size
    eid=$(echo '{"task":"embed","prompt_ids":[7,8,9,10,11]}' | ours "$BIN/redlm" enqueue \
          --redis 127.0.0.1:$port --pool fast --file - 2>>"$LOGS/worker-client.log")
    ours timeout 60 "$BIN/redlm" tail "$eid" --json --timeout 30 --redis 127.0.0.1:$port \
        > "$WORK/emb.jsonl" 2>>"$LOGS/worker-client.log"
    cat "$WORK/emb.jsonl" >> "$LOGS/worker-events.jsonl"
    emb=$("$PY" - "$WORK/emb.jsonl" "$TINY/config.json" <<'EOF'
import base64, json, math, struct, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
h = json.load(open(sys.argv[2]))["hidden_size"]
d = ev[-1] if ev else {}
ok = len(ev) == 1 and d.get("type") == "done" and d.get("dimensions") == h
if ok:
    v = struct.unpack(f"<{h}f", base64.b64decode(d["embedding"]))
    ok = abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4
print("ok" if ok else "bad")
EOF
)
    [ "$emb" = ok ] || bad=$((bad + 1))
    # the LoRA adapter (engine/cuda/lora.cu) through the worker: a greedy
    # job for model "a" and the same for the base, each done in order, and
    # the adapter's tokens not the base's
    for m in a base; do
        mf=""
        [ $m = a ] && mf='"model":"a",'
        lid=$(echo "{${mf}\"prompt_ids\":[5,6,7,8,9,10],\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}" |
              ours "$BIN/redlm" enqueue --redis 127.0.0.1:$port --pool fast --file - 2>>"$LOGS/worker-client.log")
        ours timeout 60 "$BIN/redlm" tail "$lid" --json --timeout 30 --redis 127.0.0.1:$port \
            > "$WORK/lora-$m.jsonl" 2>>"$LOGS/worker-client.log"
        cat "$WORK/lora-$m.jsonl" >> "$LOGS/worker-events.jsonl"
    done
    lora=$("$PY" - "$WORK/lora-a.jsonl" "$WORK/lora-base.jsonl" <<'EOF'
import json, sys
def toks(path):
    ev = [json.loads(l) for l in open(path) if l.startswith("{")]
    seqs = [int(e["seq"]) for e in ev if "seq" in e]
    if not ev or ev[-1].get("type") != "done" or seqs != list(range(len(seqs))):
        return None
    return [t for e in ev for t in e.get("token_ids", [])]
a, b = toks(sys.argv[1]), toks(sys.argv[2])
print("ok" if a and b and len(a) == 24 and a != b else "bad")
EOF
)
    [ "$lora" = ok ] || bad=$((bad + 1))
    if [ "$bad" = 0 ]; then st=passed; else st=failed; fi
    detail="8 jobs, an embedding and a LoRA adapter's job, $bad without done, with a seq gap, a bad vector or the base's tokens, $ntok events; $(grep -m1 "KV cache" "$LOGS/worker.log" | cut -c35- | head -c 200)"
fi
stop_proc() { # pid: SIGTERM, then SIGKILL after 20 s (a worker drains first)
    kill "$1" 2>/dev/null || return 0
    for _ in $(seq 200); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
stop_proc $WORKER_PID; WORKER_PID=""
stop_proc $REDIS_PID; REDIS_PID=""
record worker "$st" $(( $(date +%s) - s )) "$detail"

# --- a real-shaped BF16 model (random weights, made here)
if [ "$HAVE_GPU" = 1 ] && [ "$(left)" -gt 240 ]; then
    s=$(date +%s)
    if ours timeout 90 "$BIN/redlm" mkmodel --out "$WORK/q06" --shape qwen3-0.6b --dtype bf16 \
            > "$LOGS/mkmodel.log" 2>&1; then
        # 40 sequences decoding together through the batching engine
        batch_compare batch-0.6b "$WORK/q06" 40 24 150 0 64
        # teacher-forced: the last position's logits of 6 prompts on both
        # backends; the top token must agree wherever the CPU's margin
        # between its first and second exceeds 0.1 (random weights give
        # near-ties that BF16 rounding may flip, so free runs can part)
        s=$(date +%s)
        ok=1
        for i in 1 2 3 4 5 6; do
            toks=$("$PY" -c 'import random,sys; r=random.Random(int(sys.argv[1])); print(",".join(str(r.randrange(16, 5000)) for _ in range(40 * int(sys.argv[1]))))' $i)
            ours timeout 60 "$BIN/redlm" logits -m "$WORK/q06" --tokens "$toks" --backend cpu > "$WORK/lc$i.json" 2>>"$LOGS/logits.log" &&
            ours timeout 60 "$BIN/redlm" logits -m "$WORK/q06" --tokens "$toks" --backend $BE > "$WORK/lg$i.json" 2>>"$LOGS/logits.log" || ok=0
        done
        detail=$("$PY" - "$WORK" <<'EOF2'
import json, sys
w = sys.argv[1]
agree = judged = 0
worst = 0.0
for i in range(1, 7):
    try:
        a = json.load(open("%s/lc%d.json" % (w, i)))["logits"][-1]
        b = json.load(open("%s/lg%d.json" % (w, i)))["logits"][-1]
    except Exception as e:
        print("FAIL prompt %d: %s" % (i, e)); sys.exit()
    top = sorted(range(len(a)), key=lambda k: -a[k])[:2]
    scale = max(abs(x) for x in a) or 1.0
    worst = max(worst, max(abs(x - y) for x, y in zip(a, b)) / scale)
    if a[top[0]] - a[top[1]] > 0.1:
        judged += 1
        agree += int(max(range(len(b)), key=lambda k: b[k]) == top[0])
print("%s top-1 equal on %d of %d prompts with a CPU margin > 0.1; max |dlogit| / max |logit| = %.2g"
      % ("OK" if agree == judged else "FAIL", agree, judged, worst))
EOF2
)
        if [ "$ok" = 1 ] && [ "${detail:0:2}" = OK ]; then st=passed; else st=failed; fi
        record logits-0.6b "$st" $(( $(date +%s) - s )) "${detail#* }"
    else
        record batch-0.6b failed $(( $(date +%s) - s )) "mkmodel: $(tail -2 "$LOGS/mkmodel.log" | tr '\n' ' ')"
    fi
    rm -rf "$WORK/q06"
else
    record batch-0.6b skipped 0 "$([ "$HAVE_GPU" = 1 ] && echo "under 240 s left" || echo "no CUDA device")"
fi

# --- throughput
s=$(date +%s)
t=$(( $(left) - 90 - CLUSTER_S ))
[ "$t" -lt 30 ] && t=30
q=""
[ "$t" -lt 300 ] && q=--quick
ours timeout "$t" "$BIN/bench_cuda" $q > "$LOGS/bench.jsonl" 2> "$LOGS/bench.err"
rc=$?
n=$(grep -c '^{' "$LOGS/bench.jsonl")
if [ "$HAVE_GPU" = 0 ] && grep -qi 'no CUDA device' "$LOGS/bench.jsonl" "$LOGS/bench.err"; then st=no-device detail="bench_cuda: no CUDA device"
elif [ "$rc" = 0 ]; then st=passed detail="$n figures${q:+ (quick)}"
elif [ "$rc" = 124 ]; then st=failed detail="timed out after ${t}s with $n figures"
else st=failed detail="rc $rc, $n figures; $(tail -2 "$LOGS/bench.err" | tr '\n' ' ')"; fi
record bench "$st" $(( $(date +%s) - s )) "$detail"
grep '^{' "$LOGS/bench.jsonl" | head -40

# --- quantized checkpoints on CUDA (issue 28): a random Qwen3-1.7B in BF16,
# GGUF Q8_0 and Q4_K_M made here; decode at batch 1 and 16 through the
# engine (bench-engine), with the weight bytes a token reads
if [ "$HAVE_GPU" = 1 ] && [ "$BE" = cuda ] && [ "$(left)" -gt $(( 90 + CLUSTER_S )) ]; then
    s=$(date +%s)
    st=passed detail=""
    for fmt in bf16 q8_0 q4_k_m; do
        out="$WORK/q17-$fmt"
        [ "$fmt" = bf16 ] || out="$out.gguf"
        if ! ours timeout 120 "$BIN/redlm" mkmodel --out "$out" --shape qwen3-1.7b --dtype "$fmt" \
                >> "$LOGS/quant.log" 2>&1; then
            st=failed detail="$detail $fmt: mkmodel failed;"
            continue
        fi
        for b in 1 16; do
            line=$(ours timeout 90 "$BIN/redlm" bench-engine -m "$out" --prompt 512 --gen 64 --batch $b \
                   --backend cuda 2>> "$LOGS/quant.log" | grep '^{')
            if [ -z "$line" ]; then st=failed detail="$detail $fmt b$b: no figure;"; continue; fi
            echo "{\"bench\":\"quant\",\"format\":\"$fmt\",\"shape\":\"qwen3-1.7b\",\"batch\":$b,\"engine\":$line}" >> "$LOGS/bench.jsonl"
            detail="$detail $fmt b$b $("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.0f tok/s" % d["decode_tok_s"])' "$line");"
        done
        rm -rf "$out"
    done
    record quant "$st" $(( $(date +%s) - s )) "$detail"
else
    record quant skipped 0 "$([ "$HAVE_GPU" = 1 ] && [ "$BE" = cuda ] && echo "under 90 s left" || echo "no CUDA device")"
fi

cluster_step
finish
