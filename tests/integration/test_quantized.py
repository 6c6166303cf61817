"""Quantized checkpoints as users have them (issue 28), against a real
redis-server and real worker processes:

  - a worker serves jobs from an AutoAWQ INT4 safetensors checkpoint, GGUF
    Q8_0, Q4_K_M (tied: its embedding is Q6_K), Q5_0, Q3_K_M and IQ4_XS files, all made
    by `redlm mkmodel` with the tiny tokenizer (in the GGUF files, as
    metadata): every stream is schema-valid and gapless, greedy tokens equal
    `redlm run` on the same checkpoint, and a chat job (tokenized with the
    tokenizer the GGUF carries) finishes;
  - `--model ollama:NAME:TAG` resolves through an Ollama store tree the test
    builds ($OLLAMA_MODELS: manifests/registry.ollama.ai/library/NAME/TAG ->
    the model layer's blobs/sha256-<hex>), the worker announces NAME:TAG and
    serves the same tokens as the file itself; a name not in the store stops
    the worker with a message that says where it looked.
"""
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from conftest import CLI, MODEL, WORKER, check_stream, job_events
from test_models import heartbeat, procs  # noqa: F401 (fixture)

SHAPE = ["--hidden", "256", "--intermediate", "512", "--heads", "4", "--kv-heads", "2",
         "--head-dim", "64", "--layers", "2"]
FORMATS = {  # name -> (dtype, --out relative to the models dir, tied)
    "awq": ("awq", "awq", False),
    "q8_0": ("q8_0", "q8", False),
    "q4_k_m": ("q4_k_m", "q4km.gguf", True),
    # Qwen's own GGUF releases' Q5_0, and the two 3-4 bit mixes people fit
    # Qwen3-32B into 24 GB with
    "q5_0": ("q5_0", "q50.gguf", False),
    "q3_k_m": ("q3_k_m", "q3km.gguf", True),
    "iq4_xs": ("iq4_xs", "iq4xs.gguf", False),
}


# what each worker's heartbeat says its weights are (Ollama's /api/show
# details): llama.cpp's name of the GGUF's general.file_type
WEIGHTS = {"awq": ("safetensors", "AWQ"), "q8_0": ("gguf", "Q8_0"), "q4_k_m": ("gguf", "Q4_K_M"),
           "q5_0": ("gguf", "Q5_0"), "q3_k_m": ("gguf", "Q3_K_M"), "iq4_xs": ("gguf", "IQ4_XS")}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant")
    cfg = json.loads((MODEL / "config.json").read_text())
    out = {}
    for name, (dtype, rel, tied) in FORMATS.items():
        p = subprocess.run([str(CLI), "mkmodel", *SHAPE, "--vocab", str(cfg["vocab_size"]),
                            "--bos", str(cfg["bos_token_id"]), "--eos", str(cfg["eos_token_id"]),
                            "--dtype", dtype, "--seed", "3", "--tied" if tied else "--untied",
                            "--tokenizer", str(MODEL), "--out", str(d / rel)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        out[name] = json.loads(p.stdout)["out"]
    return out


def run_greedy(model, ids, n, env=None):
    p = subprocess.run([str(CLI), "run", "-m", str(model), "--tokens", ",".join(map(str, ids)),
                        "-n", str(n), "--temperature", "0", "--ignore-eos", "--threads", "1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["tokens"]


PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42] * 9]


def serve_and_check(r, prefix, client_r, name, event_validator):
    """Submits greedy and chat jobs to the worker's pools; returns the
    greedy token lists after checking every stream."""
    got = []
    for i, ids in enumerate(PROMPTS):
        jid = f"{name}-g{i}"
        r.xadd(f"{prefix}jobs:fast", {"job": json.dumps({
            "id": jid, "prompt_ids": ids, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "cache": False})})
    r.xadd(f"{prefix}jobs:fast", {"job": json.dumps({
        "id": f"{name}-chat", "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 6, "temperature": 0, "cache": False})})
    from conftest import stream_events
    for i in range(len(PROMPTS)):
        evs = stream_events(client_r, f"{prefix}out:{name}-g{i}", 120)
        toks, done = check_stream(evs, event_validator)
        assert done.get("finish_reason") == "length", done
        got.append(toks)
    evs = stream_events(client_r, f"{prefix}out:{name}-chat", 120)
    toks, done = check_stream(evs, event_validator)
    assert "error" not in done and done.get("finish_reason") in ("length", "stop"), done
    assert toks, "the chat job generated nothing"
    return got


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_worker_serves_quantized(fmt, models, procs, redis_addr, prefix,  # noqa: F811
                                 event_validator):
    from conftest import connect
    r = connect(redis_addr)
    procs["worker"](f"q-{fmt}", models[fmt], "--pools", "fast")
    hb = heartbeat(r, prefix, f"q-{fmt}")
    assert (hb["model_format"], hb["model_quantization"]) == WEIGHTS[fmt]
    got = serve_and_check(r, prefix, connect(redis_addr), fmt, event_validator)
    want = [run_greedy(models[fmt], ids, 8) for ids in PROMPTS]
    assert got == want


def ollama_store(root, name, tag, gguf):
    """An Ollama store holding gguf as NAME:TAG, laid out as `ollama pull`
    leaves it; returns the blob path."""
    data = open(gguf, "rb").read()
    digest = hashlib.sha256(data).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, blob)
    tmpl = b"{{ .Prompt }}"
    tdig = hashlib.sha256(tmpl).hexdigest()
    (root / "blobs" / f"sha256-{tdig}").write_bytes(tmpl)
    man = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    man.parent.mkdir(parents=True, exist_ok=True)
    man.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
             "size": len(data)},
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{tdig}",
             "size": len(tmpl)}]}))
    return blob


def test_ollama_store(models, procs, redis_addr, prefix, tmp_path,  # noqa: F811
                      event_validator):
    from conftest import connect
    store = tmp_path / "ollama-models"
    blob = ollama_store(store, "tinyq", "q4", models["q4_k_m"])
    env = {k: v for k, v in os.environ.items() if k != "OLLAMA_MODELS"}
    env["OLLAMA_MODELS"] = str(store)
    r = connect(redis_addr)
    procs["worker"]("oll", "ollama:tinyq:q4", "--pools", "fast", env=env)
    hb = heartbeat(r, prefix, "oll")
    assert hb["model"] == "tinyq:q4" and hb["model_owned_by"] == "ollama"
    assert hb["model_dir"] == str(blob)
    got = serve_and_check(r, prefix, connect(redis_addr), "oll", event_validator)
    assert got == [run_greedy(models["q4_k_m"], ids, 8) for ids in PROMPTS]
    assert run_greedy("ollama:tinyq:q4", PROMPTS[0], 8, env=env) == got[0]
    # a miss names the store and the manifest it looked for
    p = subprocess.run([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model",
                        "ollama:tinyq:q8", "--http-port", "0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0
    assert str(store / "manifests" / "registry.ollama.ai" / "library" / "tinyq" / "q8") in p.stderr
    assert "$OLLAMA_MODELS" in p.stderr
