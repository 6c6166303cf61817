#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] [TARGET...] - runs the libFuzzer targets that
# `make fuzz` built, SECONDS each (default 60), all of them when no TARGET is
# named (fuzz_grammar, fuzz_job, ...). SECONDS 0 runs each input of the
# seeds and the corpus once and no more (-runs=0): deterministic, what CI
# runs so that every target builds and passes what it passed before; a
# finding by a fuzzer's search is never a CI failure. Each keeps its corpus in
# build-fuzz/corpus/TARGET across runs and starts from seeds written from
# the repository's own fixtures:
#   fuzz_grammar  every schema of tests/data/schemas (and its generators
#                 folder) after the selector byte 0x00, each job's tools of
#                 schemas/examples/jobs-valid.json after 0xa0, a few
#                 grammars after 0x60;
#   fuzz_job      every job of schemas/examples/jobs-valid.json and
#                 jobs-invalid.json;
#   fuzz_embed    a body of each embedding endpoint, and done events of
#                 one to three inputs;
#   fuzz_rerank   rerank and score bodies, and done events (scores) of one
#                 to three documents, and an error after a score;
# and, for each, the inputs that once found a fault.
# A finding is written to build-fuzz/findings/TARGET-*; the script ends
# non-zero when a target found one (rerun the target on that file to see
# it). Run as root or not; needs nothing but the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in build-fuzz/fuzz/fuzz_*; do targets+=("$(basename "$f")"); done
fi
[ -x "build-fuzz/fuzz/${targets[0]}" ] || { echo "run.sh: no ${targets[0]}: make fuzz first" >&2; exit 2; }

seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
mkdir -p build-fuzz/findings
/usr/bin/python3 - "$seeds" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def put(target, name, data):
    d = out / target
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(data)
for p in sorted(pathlib.Path("tests/data/schemas").rglob("*.json")):
    put("fuzz_grammar", "schema-" + p.stem, b"\x00" + p.read_bytes())
grammars = ['root ::= cmd ("; " cmd){0,3}\ncmd ::= "go " [a-z]+ | "stop"',
            'root ::= [0-9]{2,4} "-" ("a" | "b")* "x"?',
            'root ::= obj\nobj ::= "{" ws "\\"k\\"" ws ":" ws val ws "}"\n'
            'val ::= obj | [0-9]+ | "\\"" [^"\\\\]* "\\""\nws ::= [ \\t\\n]*']
for i, g in enumerate(grammars):
    put("fuzz_grammar", f"grammar-{i}", b"\x60" + g.encode())
# what the targets found once (tests/README.md, "Fuzz"), kept as seeds
put("fuzz_grammar", "found-utf8", b'\x00{"enum":["h\xc3\xa9llo","\xe3\x81\xff"]}')
put("fuzz_job", "found-id-129", b'{"prompt":-"hi","id":"' + b"x" * 129 + b'"}')
put("fuzz_job", "found-backslash", b'{"\\')
# fuzz_embed: bodies of the three embedding endpoints (selector 0-2), and
# a worker's done events for 1, 2 and 3 inputs (selector 0x80 | api |
# base64 << 2 | (inputs - 1) << 3)
import base64, struct
for i, (sel, body) in enumerate([
        (0, {"model": "redlm", "input": ["a", "b"], "encoding_format": "base64",
             "dimensions": 4, "user": "u"}),
        (0, {"input": [[1, 2], [3]]}), (0, {"input": [1, 2, 3]}),
        (1, {"model": "redlm:latest", "input": ["a"], "truncate": False, "options": {}}),
        (2, {"model": "redlm", "prompt": "hi", "keep_alive": 0})]):
    put("fuzz_embed", f"body-{i}", bytes([sel]) + json.dumps(body).encode())
def done(vals):
    return json.dumps({"seq": 0, "type": "done", "finish_reason": "stop",
                       "usage": {"prompt_tokens": 2, "completion_tokens": 0},
                       "embedding": base64.b64encode(struct.pack(f"<{len(vals)}f", *vals)).decode(),
                       "dimensions": len(vals)})
put("fuzz_embed", "events-1", b"\x80" + done([0.6, 0.8]).encode())
put("fuzz_embed", "events-2", b"\x8d" + "\n".join([done([1.0]), done([0.0, 1.0])]).encode())
put("fuzz_embed", "events-3", b"\x96" + "\n".join([done([1.0])] * 3).encode())
put("fuzz_embed", "events-error", b"\x81" + json.dumps(
    {"seq": 0, "type": "error", "code": "PROMPT_TOO_LONG", "message": "prompt: too long"}).encode())
# fuzz_rerank: rerank and score bodies (selector 0, 1), and a worker's
# done events for 1 to 3 documents (selector 0x80 | score | top_n 1 << 2 |
# (documents - 1) << 3)
for i, (sel, body) in enumerate([
        (0, {"model": "redlm", "query": "q", "documents": ["a", {"text": "b"}], "top_n": 1,
             "return_documents": False, "instruction": "Judge."}),
        (0, {"query": "q", "documents": ["a"]}),
        (1, {"text_1": ["q1", "q2"], "text_2": ["a", "b"]}),
        (1, {"model": "redlm", "text_1": "q", "text_2": "d", "instruction": ""})]):
    put("fuzz_rerank", f"body-{i}", bytes([sel]) + json.dumps(body).encode())
def scored(s):
    return json.dumps({"seq": 0, "type": "done", "finish_reason": "stop",
                       "usage": {"prompt_tokens": 9, "completion_tokens": 0}, "score": s})
put("fuzz_rerank", "events-1", b"\x80" + scored(0.5).encode())
put("fuzz_rerank", "events-3", b"\x90" + "\n".join(map(scored, (0.1, 0.9, 0.1))).encode())
put("fuzz_rerank", "events-score-2", b"\x89" + "\n".join(map(scored, (1.0, 0.0))).encode())
put("fuzz_rerank", "events-error", b"\x88" + "\n".join([scored(0.2), json.dumps(
    {"seq": 0, "type": "error", "code": "PROMPT_TOO_LONG", "message": "prompt: too long"})]).encode())
# fuzz_compat: Anthropic Messages bodies (selector 3; 19 count_tokens), and a
# played answer's events, thinking, text and a streamed tool call (0x83)
ask = {"role": "user", "content": "Weather?"}
tools = [{"name": "w", "input_schema": {"type": "object", "properties": {"c": {"type": "string"}}}}]
for i, (sel, body) in enumerate([
        (3, {"model": "redlm", "max_tokens": 8, "system": "Be brief.", "messages": [ask],
             "stream": True, "thinking": {"type": "enabled", "budget_tokens": 4},
             "stop_sequences": ["END"], "tools": tools, "tool_choice": {"type": "any"}}),
        (3, {"max_tokens": 8, "system": [{"type": "text", "text": "s"}], "messages": [
            ask, {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": ""},
                {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "P"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "ok"}]},
                                         {"type": "text", "text": "and?"}]}],
             "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
        (19, {"model": "redlm", "messages": [ask], "thinking": {"type": "disabled"}})]):
    put("fuzz_compat", f"anthropic-{i}", bytes([sel]) + json.dumps(body).encode())
# found once: an answer all reasoning read the Responses item's text buffer
# past its end (text_reserve gave no NUL)
put("fuzz_compat", "found-responses-thinking-only", b"\x80" + "\n".join(json.dumps(e) for e in [
    {"seq": 0, "type": "delta", "delta": {"reasoning_content": "hmm"}},
    {"seq": 1, "type": "done", "finish_reason": "length",
     "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]).encode())
# found once: a second system member leaked the first
put("fuzz_compat", "found-anthropic-system-twice", b'\x03{"max_tokens": 8, "system": "a", '
    b'"messages": [{"role": "user", "content": "q"}], "system": "b"}')
# found once: n > 1 passed through an Ollama body made several jobs, which these
# APIs (one answer per request) cannot answer; cpt_parse refuses it now
put("fuzz_compat", "found-ollama-n", b'"{"n": 3,"prompt":": "}')
put("fuzz_compat", "anthropic-events", b"\x83" + "\n".join(json.dumps(e) for e in [
    {"seq": 0, "type": "delta", "delta": {"reasoning_content": "Hm"}, "token_ids": [1]},
    {"seq": 1, "type": "delta", "delta": {"content": "Ok."}, "token_ids": [2]},
    {"seq": 2, "type": "delta", "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "w", "arguments": "{\"c\": "}}]}, "token_ids": [3]},
    {"seq": 3, "type": "done", "finish_reason": "stop",
     "usage": {"prompt_tokens": 9, "completion_tokens": 3, "cached_prompt_tokens": 4},
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "w", "arguments": "{\"c\": \"P\"}"}}]}]).encode())
# Responses bodies continued from a stored conversation (0x10: cpt_parse_responses),
# items of every kind, and the same with store false
for i, body in enumerate([
        {"model": "redlm", "previous_response_id": "resp_1", "instructions": "Be brief.",
         "input": [{"type": "function_call_output", "call_id": "c1", "output": "42"}]},
        {"previous_response_id": "resp_1", "store": False, "input": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"role": "user", "content": "next"}]}]):
    put("fuzz_compat", f"responses-continued-{i}", b"\x10" + json.dumps(body).encode())
# fuzz_convo: Conversations API bodies (bit 0: an add, items required; bit 1: a
# 1 KiB bound), items of every kind and metadata
for i, (sel, body) in enumerate([
        (0, {"items": [{"type": "message", "role": "user", "content": "Hi"},
                       {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
                       {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "42", "id": "x"}],
             "metadata": {"topic": "t"}}),
        (1, {"items": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "q"}]}),
        (3, {"items": [{"role": "user", "content": "word " * 300}]}),
        (0, {})]):
    put("fuzz_convo", f"body-{i}", bytes([sel]) + json.dumps(body).encode())
n = 0
for f in ("schemas/examples/jobs-valid.json", "schemas/examples/jobs-invalid.json"):
    for j in json.loads(pathlib.Path(f).read_text()):
        text = j["job"] if isinstance(j, dict) and isinstance(j.get("job"), str) else json.dumps(j)
        n += 1
        put("fuzz_job", f"job-{n}", text.encode())
        if isinstance(j, dict) and isinstance(j.get("tools"), list):
            put("fuzz_grammar", f"tools-{n}", b"\xa0" + json.dumps(j["tools"]).encode())
EOF

found=0
for t in "${targets[@]}"; do
    corpus=build-fuzz/corpus/$t
    mkdir -p "$corpus"
    dirs=("$corpus")
    [ -d "$seeds/$t" ] && dirs+=("$seeds/$t")
    log=build-fuzz/findings/$t.log
    if [ "$secs" = 0 ]; then how=(-runs=0); else how=(-max_total_time="$secs"); fi
    if build-fuzz/fuzz/"$t" "${how[@]}" -timeout=10 -rss_limit_mb=4096 \
        -artifact_prefix=build-fuzz/findings/"$t"- "${dirs[@]}" > "$log" 2>&1; then
        done_line=$(grep -o -E 'Done [0-9]+ runs in [0-9]+ second\(s\)|INITED.*' "$log" | tail -1)
        echo "$t: ${done_line:-ran}, nothing found"
    else
        found=1
        echo "$t: FOUND something (build-fuzz/findings/$t-*; the log: $log)"
        grep -m1 -E 'ERROR|SUMMARY|deadly' "$log" || true
    fi
done
exit $found
