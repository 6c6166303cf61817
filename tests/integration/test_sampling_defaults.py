"""Sampling defaults come from the model (issue 15, section 3), through a
real worker and a real redis-server.

A job that gives no temperature / top_p / top_k / min_p runs with the
checkpoint's generation_config.json values where it has them, else Qwen3's
model-card values for the mode (thinking 0.6 / 0.95 / 20 / 0, non-thinking
0.7 / 0.8 / 20 / 0); a field the job gives always wins. The engine is the one
place that applies them (engine/engine.c sampling_defaults). Each test
compares an unset job with the same job spelt out, for the same seed: the
token ids must be identical, and they must differ from the old protocol
defaults (temperature 1, top_p 1, top_k off), so the test fails when the
defaults are not the model's."""
import json
import shutil

from conftest import MODEL, check_stream

CARD = {"think": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0},
        "fast": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0}}
OLD = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0}


def run(client, validator, job_id, pool, extra, seed=7):
    job = {"id": job_id, "messages": [{"role": "user", "content": "tell me a story"}],
           "max_tokens": 24, "seed": seed, "ignore_eos": True, "cache": False, **extra}
    client.submit(job, pool=pool)
    tokens, done = check_stream(client.events(job_id), validator)
    assert done["finish_reason"] == "length", done
    assert len(tokens) == 24
    return tokens


def test_unset_fields_take_the_card_values_per_mode(workers, client, event_validator):
    """The tiny checkpoint's generation_config.json has no sampling fields
    (only do_sample, which is not one of ours): the card values apply."""
    assert not {"temperature", "top_p", "top_k", "min_p"} & set(
        json.loads((MODEL / "generation_config.json").read_text()))
    workers("w1")
    for pool, card in CARD.items():
        unset = run(client, event_validator, f"unset-{pool}", pool, {})
        spelt = run(client, event_validator, f"card-{pool}", pool, card)
        old = run(client, event_validator, f"old-{pool}", pool, OLD)
        assert unset == spelt, pool
        assert unset != old, pool
    # a field the job gives wins over the default, the others still default
    hot = run(client, event_validator, "hot", "fast", {"temperature": 1.5})
    hot_spelt = run(client, event_validator, "hot-spelt", "fast", {**CARD["fast"], "temperature": 1.5})
    assert hot == hot_spelt


def test_generation_config_values_win_over_the_card(workers, client, event_validator, tmp_path):
    """A checkpoint whose generation_config.json has sampling fields: unset
    fields take them (in both modes), missing ones still take the card."""
    model = tmp_path / "model-gen"
    shutil.copytree(MODEL, model)
    gen = json.loads((model / "generation_config.json").read_text())
    gen.update({"temperature": 1.3, "top_p": 0.5, "top_k": 7})  # no min_p
    (model / "generation_config.json").write_text(json.dumps(gen))
    workers("w1", "--model", str(model))
    for pool in ("fast", "think"):
        unset = run(client, event_validator, f"gunset-{pool}", pool, {})
        spelt = run(client, event_validator, f"gspelt-{pool}", pool,
                    {"temperature": 1.3, "top_p": 0.5, "top_k": 7, "min_p": 0})
        card = run(client, event_validator, f"gcard-{pool}", pool, CARD[pool])
        assert unset == spelt, pool
        assert unset != card, pool
    given = run(client, event_validator, "ggiven", "fast", {"top_k": 3})
    given_spelt = run(client, event_validator, "ggiven-spelt", "fast",
                      {"temperature": 1.3, "top_p": 0.5, "top_k": 3, "min_p": 0})
    assert given == given_spelt
