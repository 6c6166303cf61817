"""JSON Schema as generators write it (issue 29): the corpus in
tests/data/schemas/generators/ (zod 4's z.toJSONSchema, written by
tests/integration/node/zod_schemas.js; Pydantic 1.10's Model.schema(),
written by pydantic_schemas.py there; a few Pydantic-2-shaped schemas
written by hand) goes through a real worker on a random-weight checkpoint
with the real Qwen3 vocabulary: every schema is accepted (no error event)
and every output parses and validates with Debian's python3-jsonschema
(Draft 2020-12; Draft 7 for Pydantic 1's schemas) and a format checker for date-time, date, email and uuid.

"time" is left out of the checker: zod's z.iso.time() writes format "time"
(RFC 3339: an offset is required) beside a pattern that forbids the
offset, so no string satisfies both; the grammar follows the pattern.

Also: the corpus files are what the generators write today (the scripts
are rerun into a temporary folder and compared), and zod's intersection of
two strict objects, which no object satisfies, is refused."""
import json
import pathlib
import shutil
import subprocess

import jsonschema
import pytest

from conftest import DATA, ROOT
from test_structured import VocabWorker, run, vocab_model  # noqa: F401

GEN = DATA / "schemas" / "generators"
SCHEMAS = sorted(GEN.glob("*.json"))
NODE_DIR = ROOT / "tests" / "integration" / "node"
# (seed, temperature), as test_structured.py
SETTINGS = [(1, 0.0), (7, 0.7), (23, 1.0)]


@pytest.fixture
def worker(vocab_model, redis_addr, prefix, tmp_path):  # noqa: F811
    w = VocabWorker(redis_addr, prefix, vocab_model, tmp_path)
    yield w
    w.stop()


def checker():
    fc = jsonschema.FormatChecker()
    for f in list(fc.checkers):
        if f not in ("date-time", "date", "email", "uuid"):
            fc.checkers.pop(f)
    return fc


def job(i, path, seed, temp):
    return {"id": f"g{i}-{seed}", "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": 1500, "seed": seed, "temperature": temp,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": path.stem.replace(".", "_")[:64], "strict": True,
                "schema": json.loads(path.read_text())}}}


def test_corpus_size_and_sources():
    names = [p.name for p in SCHEMAS]
    assert len(SCHEMAS) >= 60, len(SCHEMAS)
    assert sum(n.startswith("zod-") for n in names) >= 30
    assert sum(n.startswith("pydantic1-") for n in names) >= 20
    assert sum(n.startswith("pydantic2-") for n in names) >= 5


def test_corpus_is_what_generators_write(tmp_path):
    """The scripts write the files in the corpus, byte for byte (skipped
    where zod or pydantic is not installed: make deps installs both)."""
    node = shutil.which("node")
    if node and (NODE_DIR / "node_modules" / "zod").exists():
        out = tmp_path / "zod"
        subprocess.run([node, str(NODE_DIR / "zod_schemas.js"), str(out)], check=True,
                       capture_output=True, timeout=60)
        for p in out.glob("*.json"):
            assert p.read_text() == (GEN / p.name).read_text(), p.name
    try:
        import pydantic  # noqa: F401
    except ImportError:
        pydantic = None
    if pydantic is not None and pydantic.VERSION.startswith("1."):
        out = tmp_path / "pyd"
        out.mkdir()
        subprocess.run(["/usr/bin/python3", str(GEN / "pydantic_schemas.py"), str(out)],
                       check=True, capture_output=True, timeout=60)
        for p in out.glob("*.json"):
            assert p.read_text() == (GEN / p.name).read_text(), p.name


def test_generator_corpus_accepted_and_valid(worker, client, event_validator):
    jobs, want = [], {}
    for i, path in enumerate(SCHEMAS):
        for seed, temp in SETTINGS:
            j = job(i, path, seed, temp)
            jobs.append(j)
            want[j["id"]] = (path, json.loads(path.read_text()))
    res = run(client, event_validator, jobs)
    refused, bad = [], []
    fc = checker()
    for jid, (content, _, evs) in res.items():
        path, schema = want[jid]
        done = evs[-1][1]
        errs = [e for _, e in evs if e["type"] == "error"]
        if errs:
            refused.append(f"{path.name}: {errs[0].get('code')} {errs[0].get('message')}")
            continue
        try:
            assert done["finish_reason"] == "stop", done["finish_reason"]
            doc = json.loads(content)
            # Pydantic 1 writes draft 7 (definitions, items as an array)
            cls = (jsonschema.Draft7Validator if path.name.startswith("pydantic1-")
                   else jsonschema.Draft202012Validator)
            cls(schema, format_checker=fc).validate(doc)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append(f"{path.name} {jid}: {str(e)[:200]} in {content[:200]!r}")
    n = len(res)
    print(f"generator corpus: {len(SCHEMAS)} schemas, {n} outputs, "
          f"{n - len(refused)} accepted, {n - len(refused) - len(bad)} valid")
    assert not refused, f"{len(refused)} of {n} refused:\n" + "\n".join(sorted(set(refused)))
    assert not bad, f"{len(bad)} of {n} outputs fail:\n" + "\n".join(bad)


def test_unsatisfiable_intersection_refused(worker, client, event_validator):
    """zod's z.object({a}).and(z.object({b})): each member shuts out the
    other's required property (additionalProperties false)."""
    schema = {"allOf": [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
         "additionalProperties": False},
        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"],
         "additionalProperties": False}]}
    j = {"id": "inter", "messages": [{"role": "user", "content": "x"}], "max_tokens": 50,
         "response_format": {"type": "json_schema", "json_schema": {"name": "i", "schema": schema}}}
    res = run(client, event_validator, [j])
    errs = [e for _, e in res["inter"][2] if e["type"] == "error"]
    assert errs and errs[0]["code"] == "BAD_PARAM", res["inter"][2]
    assert "no object satisfies this schema" in errs[0]["message"], errs[0]
