"""Errors where the client looks (issue 26): a job that does not parse but
names its id is answered on that id's stream, by the worker and by the
dispatcher, with a code and a sentence that say what is wrong. The cases
are what Python's json.dumps writes by default: NaN, Infinity and
-Infinity (allow_nan=True), and a lone UTF-16 surrogate as a \\ud800
escape (ensure_ascii=True)."""
import json

import pytest

from conftest import check_stream, connect, stream_events

CASES = [
    ({"prompt_ids": [1, 2], "temperature": float("nan")}, "NaN"),
    ({"prompt_ids": [1, 2], "metadata": {"x": float("inf")}}, "Infinity"),
    ({"prompt_ids": [1, 2], "top_p": float("-inf")}, "-Infinity"),
    ({"prompt": "a\ud800b"}, "surrogate"),
    ({"messages": [{"role": "user", "content": "\udc00"}]}, "surrogate"),
]


def check_answer(r, key, word, validator):
    evs = stream_events(r, key, timeout=20)
    check_stream(evs, validator)
    err = evs[0][1]
    assert err["type"] == "error" and err["code"] == "INVALID_JSON", err
    assert word in err["message"], err
    assert evs[-1][1]["finish_reason"] == "error"


@pytest.mark.parametrize("i", range(len(CASES)))
def test_python_json_answered_on_its_id_by_the_worker(workers, client, prefix, event_validator,
                                                      i):
    workers("w1")
    doc, word = CASES[i]
    text = json.dumps({"id": f"py{i}", **doc})  # Python's defaults, as a backend sends it
    client.submit(None, raw=text)
    check_answer(client.r, f"{prefix}out:py{i}", word, event_validator)


def test_python_json_answered_on_its_id_by_the_dispatcher(dispatchers, redis_addr, prefix,
                                                          event_validator):
    r = connect(redis_addr)
    dispatchers("d1")
    for i, (doc, word) in enumerate(CASES):
        entry = r.xadd(f"{prefix}requests", {"job": json.dumps({"id": f"dp{i}", **doc})})
        check_answer(r, f"{prefix}out:dp{i}", word, event_validator)
        assert not r.exists(f"{prefix}out:r{entry}")
