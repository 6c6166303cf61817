"""redlm bench-engine on the tiny model: the JSON that make bench and
BENCHMARKS.md read, its arithmetic, and bad arguments refused.

Speed itself is never asserted (the machines are shared); the figures'
relations are: the roofline is the better of the two bandwidth probes over
the bytes of weights a decode step reads, and the per-phase profile adds
up to its own total."""
import json
import os
import subprocess

import pytest

from conftest import CLI, MODEL


def bench(*args, timeout=120):
    return subprocess.run([str(CLI), "bench-engine", "-m", str(MODEL), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_bench_engine_prints_consistent_figures(built):
    p = bench("--prompt", "8", "--gen", "5", "--batch", "2", "--threads", "2")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["prompt"], d["gen"], d["batch"]) == (8, 5, 2)
    assert d["prefill_tok_s"] > 0 and d["decode_tok_s"] > 0
    before, after = d["mem_read_gb_s_before_after"]
    assert before > 0 and after > 0
    assert d["mem_read_gb_s"] == pytest.approx(max(before, after), abs=0.01)
    # weights read per step: every layer matrix plus the vocabulary matrix,
    # counted from the checkpoint's own config (bf16 or f32 as stored)
    cfg = json.loads((MODEL / "config.json").read_text())
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = cfg.get("head_dim", H // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    elems = L * (H * q + 2 * H * kv + q * H + 3 * H * I) + V * H
    assert d["weight_bytes_per_token"] % elems == 0
    assert d["weight_bytes_per_token"] // elems in (2, 4)
    assert d["roofline_decode_tok_s"] == pytest.approx(
        d["mem_read_gb_s"] * 1e9 / d["weight_bytes_per_token"], rel=1e-3)
    for phase, steps, tokens in (("profile_prefill", 2, 16), ("profile_decode", 4, 8)):
        prof = d[phase]
        assert (prof["steps"], prof["tokens"]) == (steps, tokens)
        parts = sum(v for k, v in prof.items() if k.endswith("_ms") and k != "total_ms")
        assert parts == pytest.approx(prof["total_ms"], abs=0.01 * len(prof))


@pytest.mark.parametrize("args, word", [
    (["--prompt", "0"], "--prompt"),
    (["--batch", "-1"], "--batch"),
    (["--gen", "x"], "--gen"),
    (["--threads", "0"], "--threads"),
    (["--bogus"], "--bogus"),
    (["--temperature", "-1"], "--temperature needs a number >= 0"),
    (["--gen"], "--gen needs a value"),
    # the speculating bench's options go through the same option table
    (["--speculative", "oracle", "--reps", "0"], "--reps: 0 is out of range"),
    (["--speculative", "oracle", "--spec-correct", "101"], "--spec-correct"),
    (["--speculative", "oracle", "--spec-tokens"], "--spec-tokens needs a value"),
    (["--speculative", "oracle", "--temperature", "0.5"], "only 0 (greedy)"),
    (["--speculative", "oracle", "--bogus"], "unknown option --bogus"),
    (["--speculative", "eagle"], "--speculative: off, ngram or oracle"),
])
def test_bench_engine_refuses_bad_arguments(built, args, word):
    p = bench(*args, timeout=30)
    assert p.returncode != 0
    assert word in p.stderr
    assert p.stdout == ""


def test_bench_engine_names_a_missing_model(built, tmp_path):
    p = subprocess.run([str(CLI), "bench-engine", "-m", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "nope" in p.stderr
