"""SIGHUP on a real worker: the options the table in common/config.c marks
live change (default_max_tokens here), the others keep their running values
(kv_budget_mb: the KV pool is not resized), and a config that no longer
loads keeps the old settings. The reload is table-driven (wopts_reload ->
cfg_apply_live), so this also proves that no hand-kept list is needed."""
import signal
import time

from conftest import check_stream, read_heartbeat


def write_conf(path, max_tokens, kv_mb):
    path.write_text(f"default_max_tokens = {max_tokens};\nkv_budget_mb = {kv_mb};\n")


def n_tokens(client, validator, job_id):
    client.submit({"id": job_id, "prompt_ids": [1, 2, 3], "ignore_eos": True,
                   "temperature": 0, "cache": False})
    tokens, done = check_stream(client.events(job_id), validator)
    assert done["finish_reason"] == "length", done
    return len(tokens)


def heartbeat(client, name):
    return read_heartbeat(client.r, client.prefix, "worker", name, 10)


def wait_log(w, text, n):
    deadline = time.time() + 10
    while w.text().count(text) < n:
        assert time.time() < deadline, f"no {text!r} in the log"
        time.sleep(0.05)


def test_sighup_applies_live_options_only(workers, client, event_validator, tmp_path):
    conf = tmp_path / "w.conf"
    write_conf(conf, 5, 8)
    w = workers("rl", "-c", str(conf))
    assert n_tokens(client, event_validator, "before") == 5
    blocks = heartbeat(client, "rl")["kv_blocks"]

    write_conf(conf, 3, 16)  # one live option, one that needs a restart
    w.signal(signal.SIGHUP)
    wait_log(w, "SIGHUP: settings reloaded", 1)
    assert n_tokens(client, event_validator, "after") == 3
    client.r.delete(f"{client.prefix}worker:rl")
    assert heartbeat(client, "rl")["kv_blocks"] == blocks

    conf.write_text("default_max_tokens = ;\n")  # does not parse
    w.signal(signal.SIGHUP)
    wait_log(w, "SIGHUP: keeping the old settings", 1)
    assert n_tokens(client, event_validator, "kept") == 3
