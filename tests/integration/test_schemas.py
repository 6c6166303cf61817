"""The protocol schemas in schemas/: they are valid JSON Schema, the example
documents in schemas/examples/ are valid (or invalid) against them, and the
error-code table agrees with errors.md and with the codes the schemas use.

The same example files are read by the C unit tests (tests/unit/test_job.c
parses every invalid job and checks its code and field; test_event.c checks
that the C event builders write exactly events.json and dead-letters.json),
so schema and C code are held to one corpus.

Run with Debian's interpreter: /usr/bin/python3 -m pytest tests/integration
"""
import json
import pathlib
import re

import jsonschema
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
EXAMPLES = SCHEMAS / "examples"
SCHEMA_FILES = ["job.schema.json", "event.schema.json", "dead-letter.schema.json"]


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def validator(name):
    schema = load(SCHEMAS / name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=jsonschema.FormatChecker())


def strict_loads(text):
    """json.loads as strictly as common/job.c: duplicate names and lone
    surrogates are errors (Python accepts both by default)."""

    def pairs(items):
        keys = [k for k, _ in items]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate field")
        return dict(items)

    doc = json.loads(text, object_pairs_hook=pairs)
    text.encode("utf-8")  # raises on lone surrogates that came from \ud800
    json.dumps(doc, ensure_ascii=False).encode("utf-8")
    return doc


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_schema_is_valid(name):
    schema = load(SCHEMAS / name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_valid_jobs():
    v = validator("job.schema.json")
    docs = load(EXAMPLES / "jobs-valid.json")
    assert docs
    for doc in docs:
        v.validate(doc)


def test_invalid_jobs_fail_the_schema():
    v = validator("job.schema.json")
    codes = {c["code"] for c in load(SCHEMAS / "errors.json")["codes"]}
    cases = load(EXAMPLES / "jobs-invalid.json")
    assert len(cases) >= 100
    seen = set()
    for case in cases:
        assert case["code"] in codes, case
        seen.add(case["code"])
        try:
            doc = strict_loads(case["job"])
        except ValueError:
            continue  # not JSON (or not strict JSON): rejected before the schema
        errors = list(v.iter_errors(doc))
        assert errors, f"schema accepts a job the C parser rejects: {case}"
    # the corpus covers every code that a job's text alone can earn
    for code in ["INVALID_JSON", "NOT_OBJECT", "UNKNOWN_FIELD", "DUPLICATE_FIELD", "BAD_TYPE",
                 "OUT_OF_RANGE", "BAD_VALUE", "BAD_ID", "MISSING_PROMPT", "CONFLICTING_PROMPT",
                 "MISSING_FIELD", "BAD_PARAM"]:
        assert code in seen, code


def test_every_known_field_is_in_the_schema():
    props = set(load(SCHEMAS / "job.schema.json")["properties"])
    issue_fields = {"id", "messages", "tools", "prompt", "prompt_ids", "mode", "max_tokens",
                    "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "seed", "stop", "ignore_eos",
                    "max_thinking_tokens", "logprobs", "priority", "deadline_ms", "cache",
                    "stream_ttl_s", "metadata"}
    assert issue_fields <= props
    # speculative: issue 18, model: issue 15, structured output: issue 17,
    # client_lease_ms: issue 26; min_tokens, stop_token_ids, logit_bias: issue 29;
    # task, dimensions, truncate and normalize: embeddings
    assert props - issue_fields == {"pool", "speculative", "model", "response_format",
                                    "tool_choice", "grammar", "client_lease_ms", "min_tokens",
                                    "stop_token_ids", "logit_bias", "skip_special_tokens",
                                    "task", "dimensions", "truncate", "normalize", "query",
                                    "document", "instruction", "continue_final_message"}


def test_events():
    v = validator("event.schema.json")
    events = load(EXAMPLES / "events.json")
    types = set()
    for ev in events:
        v.validate(ev)
        types.add(ev["type"])
    assert types == {"delta", "done", "error"}
    codes = {c["code"] for c in load(SCHEMAS / "errors.json")["codes"]}
    for ev in events:
        if ev["type"] == "error":
            assert ev["code"] in codes


def test_bad_events_fail():
    v = validator("event.schema.json")
    good_done = load(EXAMPLES / "events.json")[2]
    bad = [
        {"seq": -1, "type": "delta", "delta": {}, "token_ids": []},
        {"seq": 0, "type": "delta", "delta": {"text": "x"}, "token_ids": []},
        {"seq": 0, "type": "delta", "delta": {}},
        {"seq": 0, "type": "delta", "delta": {"tool_calls": [{"function": {"arguments": "{"}}]},
         "token_ids": []},
        {"seq": 0, "type": "delta", "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
         "token_ids": []},
        {"seq": 0, "type": "tick"},
        {"seq": 0, "type": "error", "code": "bad code", "message": "x"},
        {"seq": 0, "type": "error", "code": "INTERNAL"},
        {**good_done, "finish_reason": "eos"},
        {**good_done, "extra": 1},
        {k: v2 for k, v2 in good_done.items() if k != "usage"},
    ]
    for doc in bad:
        assert list(v.iter_errors(doc)), doc


def test_seq_gapless_per_request():
    """events.json holds several requests back to back; each done closes one
    and within each the seqs run on without gaps or repeats."""
    events = load(EXAMPLES / "events.json")
    prev = -1
    for ev in events:
        assert ev["seq"] == prev + 1, ev
        prev = -1 if ev["type"] == "done" else ev["seq"]
    assert prev == -1, "the last request has no done event"


def test_dead_letters():
    v = validator("dead-letter.schema.json")
    codes = {c["code"] for c in load(SCHEMAS / "errors.json")["codes"]}
    docs = load(EXAMPLES / "dead-letters.json")
    assert docs
    for doc in docs:
        v.validate(doc)
        assert doc["code"] in codes


def test_error_table_matches_markdown():
    codes = load(SCHEMAS / "errors.json")["codes"]
    names = [c["code"] for c in codes]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name)
    md = (SCHEMAS / "errors.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| (.+) \|$", md, re.M)
    assert [r[0] for r in rows] == names
    assert [r[1] for r in rows] == [c["meaning"] for c in codes]
    for required in ["INVALID_JSON", "UNKNOWN_FIELD", "BAD_TYPE", "OUT_OF_RANGE",
                     "PROMPT_TOO_LONG", "UNKNOWN_POOL", "TOO_MANY_DELIVERIES", "CANCELLED"]:
        assert required in names
