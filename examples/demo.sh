#!/usr/bin/env bash
# The demo `make demo` runs: the whole system on one machine.
#
#   redis-server (private, on a free loopback port, in a temp dir)
#   redlm-worker on the CPU backend, pools fast and think, serving a small
#       random-weight Qwen3 checkpoint with the real Qwen3 vocabulary
#       (made once into $BUILD/models/demo-qwen3; the words are nonsense,
#       the pipeline is the real one)
#   redlm-dispatcher, routing redlm:requests to the pools, with its
#       OpenAI-compatible API on port DEMO_API_PORT (default 8000; busy: a
#       free one) for the SDKs people already use (when it is built; without
#       it the web backend writes to redlm:jobs:fast itself)
#   the example web backend and chat page (examples/web/server.py)
#
# It prints the chat page's URL, the OpenAI base URL with a curl line, and a
# `redlm chat` command line, then waits.
# Ctrl-C stops every process it started (SIGTERM, then SIGKILL after 15 s),
# removes the temp dir and exits 0. A child that dies on its own stops the
# demo with its log and exit status 1.
#
#   examples/demo.sh [--smoke] [MESSAGE]
#   --smoke (or DEMO_SMOKE=1): bring everything up, send MESSAGE through the
#       web backend and through the OpenAI API, print the answers, shut
#       down; the exit status says whether both arrived.
#   DEMO_PORT (default 8080; 0 or busy: a free port), DEMO_THREADS (worker
#   threads, default all cores), DEMO_MAX_TOKENS (default 128), BUILD.
set -euo pipefail
BUILD=${BUILD:-build}
PY=/usr/bin/python3 # Debian's, with python3-redis
cd "$(dirname "$0")/.."

smoke=${DEMO_SMOKE:-0} message="Tell me about Redis streams."
for a in "$@"; do
    case $a in
    --smoke) smoke=1 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "demo: unknown option $a (try --help)" >&2; exit 2 ;;
    *) message=$a ;;
    esac
done
for f in "$BUILD/redlm" "$BUILD/redlm-worker"; do
    [ -x "$f" ] || { echo "demo: $f is not built (run make)" >&2; exit 1; }
done
command -v redis-server >/dev/null || { echo "demo: redis-server is missing (make deps)" >&2; exit 1; }

model="$BUILD/models/demo-qwen3"
if [ ! -f "$model/config.json" ]; then
    echo "demo: making a random Qwen3 checkpoint (hidden 256, 4 layers, real vocabulary) in $model"
    # into a temp dir first, so an interrupted run never leaves half a model
    rm -rf "$model.tmp.$$"
    "$BUILD/redlm" mkmodel --shape tiny --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
        --head-dim 64 --vocab 151936 --dtype bf16 --tokenizer engine/tokenizers/qwen3 \
        --out "$model.tmp.$$" >/dev/null
    mv -T "$model.tmp.$$" "$model" 2>/dev/null || rm -rf "$model.tmp.$$" # lost a race: theirs is fine
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/redlm-demo.XXXXXX")
names=() pids=()

# Stops the children newest first (the web backend before the workers
# before Redis), each with SIGTERM and up to 15 s to finish, then removes
# the temp dir. Runs once, on any way out.
cleanup() {
    trap - INT TERM EXIT
    local i pid
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        pid=${pids[i]}
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "demo: ${names[i]} did not stop in 15 s; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap 'echo; echo "demo: stopping"; cleanup; echo "demo: stopped"; exit 0' INT TERM HUP
trap 'cleanup' EXIT

# start NAME CMD...: runs CMD in the background, its output in $tmp/NAME.log,
# in a session of its own: a Ctrl-C reaches only this script, which stops
# the children in order (in the terminal's group, Redis took the SIGINT at
# once and the loop below could see it gone before the trap ran). setsid
# execs in place (a background child is no group leader): $! is CMD's pid.
start() {
    local name=$1
    shift
    setsid "$@" >"$tmp/$name.log" 2>&1 &
    names+=("$name") pids+=($!)
}

# wait_for NAME PATTERN SECONDS: until NAME's log has PATTERN; fails if it died
wait_for() {
    local i=$((${#pids[@]} - 1)) deadline=$((SECONDS + $3))
    while ! grep -q "$2" "$tmp/$1.log" 2>/dev/null; do
        if ! kill -0 "${pids[i]}" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            echo "demo: $1 did not start; its log:" >&2
            tail -n 20 "$tmp/$1.log" >&2
            exit 1
        fi
        sleep 0.05
    done
}

free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_free() { $PY -c 'import socket, sys; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null; }

rport=$(free_port)
redis="127.0.0.1:$rport"
start redis redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$tmp" --logfile ''
wait_for redis "Ready to accept connections" 20

threads=${DEMO_THREADS:-$(nproc 2>/dev/null || echo 2)}
start worker "$BUILD/redlm-worker" --redis "$redis" --model "$model" --pools fast,think \
    --name demo-cpu0 --threads "$threads" --http-port 0
wait_for worker "ready:" 120

web_args=() chat_args="" api=""
if [ -x "$BUILD/redlm-dispatcher" ]; then
    aport=${DEMO_API_PORT:-8000}
    [ "$aport" != 0 ] && ! port_free "$aport" && aport=0
    [ "$aport" = 0 ] && aport=$(free_port)
    start dispatcher "$BUILD/redlm-dispatcher" --redis "$redis" --name demo-disp0 --http-port 0 --http "$aport"
    wait_for dispatcher "ready" 30
    # the API lists and accepts a model once a worker's heartbeat names it
    wait_for dispatcher "model .* served" 30
    route="redlm:requests -> redlm-dispatcher -> redlm:jobs:fast|think"
    api="http://127.0.0.1:$aport/v1"
else
    web_args=(--pool fast) # no dispatcher built: straight to the pool
    chat_args=" --pool fast"
    route="redlm:jobs:fast (no dispatcher built)"
fi

wport=${DEMO_PORT:-8080}
[ "$wport" != 0 ] && ! port_free "$wport" && wport=0
start web $PY examples/web/server.py --redis "$redis" --listen "127.0.0.1:$wport" \
    --max-tokens "${DEMO_MAX_TOKENS:-128}" "${web_args[@]}"
wait_for web "listening on" 30
url=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$tmp/web.log" | head -n 1)

summary=""
for i in "${!names[@]}"; do summary+=" ${names[i]}=${pids[i]}"; done
cat <<EOF

  redlm demo is up
    chat page   $url
    OpenAI API  ${api:-(needs redlm-dispatcher)}${api:+   (base_url for the openai SDKs; no API key needed)}
    terminal    $BUILD/redlm chat --redis $redis$chat_args
    Redis       $redis (private; try: redis-cli -p $rport XRANGE redlm:out:<id> - +)
    model       $model on the CPU backend, $threads threads
    jobs go to  $route
    logs        $tmp/*.log
  demo: pids$summary
  demo: temp dir $tmp

EOF
if [ -n "$api" ]; then
    cat <<EOF
  try the API:
    curl -s $api/chat/completions -H 'Content-Type: application/json' \\
      -d '{"model": "demo-qwen3", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi!"}]}'

EOF
fi

if [ "$smoke" = 1 ]; then
    echo "demo: smoke test: asking \"$message\""
    rc=0
    $PY examples/web/ask.py "$url" "$message" --max-tokens "${DEMO_MAX_TOKENS:-32}" --timeout 120 || rc=$?
    if [ -n "$api" ] && [ $rc = 0 ]; then
        echo "demo: smoke test: the same through the OpenAI API ($api)"
        $PY - "$api" "$message" <<'PYEOF' || rc=$?
import json, sys, urllib.error, urllib.request
api, message = sys.argv[1], sys.argv[2]
with urllib.request.urlopen(api + "/models", timeout=30) as r:
    model = json.load(r)["data"][0]["id"]
body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": message}]}
req = urllib.request.Request(api + "/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.load(r)
except urllib.error.HTTPError as e:
    sys.exit("demo: the API answered %d: %s" % (e.code, e.read().decode(errors="replace")))
choice = out["choices"][0]
print(choice["message"].get("content") or "", "|", choice["finish_reason"], "|", out["usage"])
sys.exit(0 if out["usage"]["completion_tokens"] > 0 else 1)
PYEOF
    fi
    echo "demo: smoke test $([ $rc = 0 ] && echo passed || echo "failed ($rc)")"
    cleanup
    exit $rc
fi

echo "Press Ctrl-C to stop everything."
# wait -n returns when a child exits (a trapped Ctrl-C interrupts it first)
while :; do
    wait -n "${pids[@]}" || true
    for i in "${!pids[@]}"; do
        if ! kill -0 "${pids[i]}" 2>/dev/null; then
            echo "demo: ${names[i]} exited unexpectedly; its log:" >&2
            tail -n 20 "$tmp/${names[i]}.log" >&2
            exit 1
        fi
    done
done
