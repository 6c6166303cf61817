"""The fleet's figures on the front door's /metrics, the Grafana dashboard
in examples/, and worker metrics beyond loopback (issue 29, "Metrics and
ops"), end to end through a real redis-server, dispatcher and workers:

  - jobs XADDed straight to a pool stream (never through the front door)
    show in vllm:num_requests_running and vllm:kv_cache_usage_perc while
    they run, and in vllm:prefix_cache_queries_total / _hits_total and
    vllm:num_preemptions_total after, equal to the worker's heartbeat, and
    in vllm:time_to_first_token_seconds / vllm:e2e_request_latency_seconds
    (the workers' histograms, summed: the front door saw no request);
  - every metric that examples/grafana/redlm-vllm-dashboard.json's PromQL
    names exists on a live front door's /metrics, with the model_name its
    $model_name variable offers, after a few requests;
  - metrics_bind = 0.0.0.0 (and :: where the host has IPv6) puts the
    worker's /metrics on every address, scraped through loopback; a bad
    address stops the worker with a clear error.
"""
import json
import pathlib
import re
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import MODEL, ROOT, WORKER, Client, connect, free_port, promtool_check
from test_compat_api import metric
from test_http import MODEL_NAME, front  # noqa: F401

DASHBOARD = ROOT / "examples" / "grafana" / "redlm-vllm-dashboard.json"
LAB = {"model_name": MODEL_NAME}


def val(text, name, **labels):
    """metric()'s value, or None while the sample is not on the page."""
    try:
        return metric(text, name, **labels)
    except AssertionError:
        return None


def page(f):
    status, _, data = f.request("GET", "/metrics")
    assert status == 200
    return data.decode()


def wait_page(f, ok, what, timeout=30):
    """The /metrics page once ok(page) holds (the dispatcher reads the
    heartbeats every interval); fails naming what after timeout."""
    deadline = time.time() + timeout
    while True:
        text = page(f)
        if ok(text):
            return text
        assert time.time() < deadline, f"{what}; last page:\n{text}"
        time.sleep(0.1)


def test_fleet_counts_jobs_sent_to_redis(front, workers, redis_addr, prefix):  # noqa: F811
    """A job XADDed to jobs:fast shows as running with KV blocks in use;
    after it the gauges fall to 0 and the prefix cache counters equal the
    worker's heartbeat (hits > 0 once the same prompt came twice), all
    under the front door's served name, though the front door saw no
    request; so do the latency histograms (the workers' sums, vLLM's
    buckets: TTFT, e2e, time per output token, prompt and generation
    lengths, queue, prefill and decode times). When that worker leaves and another takes a job, the
    counters and histograms add on to what it had counted."""
    f = front()
    w1 = workers("w1")
    c = Client(redis_addr, prefix)
    r = connect(redis_addr)
    prompt = list(range(1, 41))  # longer than a KV block: the second run hits the cache
    c.submit({"id": "long", "prompt_ids": prompt, "max_tokens": 30000, "temperature": 0,
              "ignore_eos": True})
    text = wait_page(f, lambda t: val(t, "vllm:num_requests_running", **LAB) == 1 and
                     (val(t, "vllm:kv_cache_usage_perc", **LAB) or 0) > 0,
                     "the direct job never showed as running with KV in use")
    assert 0 < metric(text, "vllm:kv_cache_usage_perc", **LAB) <= 1
    assert metric(text, "vllm:e2e_request_latency_seconds_count", **LAB) == 0
    r.set(f"{prefix}cancel:long", 1, ex=600)
    assert c.events("long")[-1][1]["type"] == "done"
    c.submit({"id": "again", "prompt_ids": prompt, "max_tokens": 2, "temperature": 0})
    c.events("again")

    def settled(t):
        hb = json.loads(r.get(f"{prefix}worker:w1"))
        return (hb["running"] == 0 and hb["prefix_hit_tokens"] > 0 and
                val(t, "vllm:num_requests_running", **LAB) == 0 and
                val(t, "vllm:kv_cache_usage_perc", **LAB) == 0 and
                val(t, "vllm:prefix_cache_hits_total", **LAB) == hb["prefix_hit_tokens"] and
                val(t, "vllm:prefix_cache_queries_total", **LAB) ==
                hb["prefix_hit_tokens"] + hb["prefix_miss_tokens"] and
                val(t, "vllm:num_preemptions_total", **LAB) == hb["preemptions"] and
                hb["ttft_count"] >= 2 and
                val(t, "vllm:time_to_first_token_seconds_count", **LAB) == hb["ttft_count"] and
                val(t, "vllm:e2e_request_latency_seconds_count", **LAB) == hb["e2e_count"] and
                val(t, "vllm:time_per_output_token_seconds_count", **LAB) == hb["tpot_count"] and
                val(t, "vllm:request_prompt_tokens_count", **LAB) == hb["prompt_len_count"] and
                val(t, "vllm:request_generation_tokens_count", **LAB) == hb["gen_len_count"] and
                val(t, "vllm:request_queue_time_seconds_count", **LAB) == hb["queue_time_count"]
                and val(t, "vllm:request_decode_time_seconds_count", **LAB) ==
                hb["decode_time_count"])
    text = wait_page(f, settled, "the fleet's figures never matched the heartbeat")
    # the two direct jobs are in the TTFT histogram, bucket by bucket as
    # the worker's heartbeat has them, under vLLM's bounds
    hb = json.loads(r.get(f"{prefix}worker:w1"))
    ttft = "vllm:time_to_first_token_seconds"
    assert len(hb["ttft_buckets"]) == 22 and len(hb["e2e_buckets"]) == 21
    assert metric(text, ttft + "_bucket", le="+Inf", **LAB) == hb["ttft_count"] >= 2
    assert metric(text, ttft + "_bucket", le="2560", **LAB) == hb["ttft_buckets"][-1] >= 2
    assert metric(text, ttft + "_bucket", le="0.001", **LAB) == hb["ttft_buckets"][0]
    assert metric(text, ttft + "_bucket", le="1", **LAB) == hb["ttft_buckets"][11]
    assert abs(metric(text, ttft + "_sum", **LAB) - hb["ttft_sum"]) < 1e-3
    assert metric(text, "vllm:e2e_request_latency_seconds_bucket", le="7680", **LAB) == \
        hb["e2e_buckets"][-1]
    # TPOT: one observation per token gap ("again" has one, "long" many);
    # the lengths: one per finished job, the 40-token prompt in (20, 50]
    tpot, plen, glen = ("vllm:time_per_output_token_seconds", "vllm:request_prompt_tokens",
                        "vllm:request_generation_tokens")
    assert len(hb["tpot_buckets"]) == 19 and len(hb["prompt_len_buckets"]) == 16
    assert metric(text, tpot + "_count", **LAB) == hb["tpot_count"] >= 2
    assert metric(text, tpot + "_bucket", le="80", **LAB) == hb["tpot_buckets"][-1]
    assert metric(text, tpot + "_bucket", le="0.01", **LAB) == hb["tpot_buckets"][0]
    assert abs(metric(text, tpot + "_sum", **LAB) - hb["tpot_sum"]) < 1e-3
    assert hb["prompt_len_count"] == hb["gen_len_count"] == hb["e2e_count"] >= 2
    assert metric(text, plen + "_count", **LAB) == hb["prompt_len_count"]
    assert metric(text, plen + "_bucket", le="20", **LAB) == hb["prompt_len_buckets"][4] == 0
    assert metric(text, plen + "_bucket", le="50", **LAB) == hb["prompt_len_buckets"][5] == \
        hb["prompt_len_count"]
    assert metric(text, plen + "_sum", **LAB) == hb["prompt_len_sum"] == 40 * hb["prompt_len_count"]
    assert metric(text, glen + "_bucket", le="2", **LAB) == hb["gen_len_buckets"][1] >= 1
    assert metric(text, glen + "_bucket", le="100000", **LAB) == hb["gen_len_buckets"][-1]
    assert metric(text, glen + "_sum", **LAB) == hb["gen_len_sum"]
    # queue, prefill and decode times: one each per finished job, the
    # direct ones counted; they split e2e, so each sum is within its sum
    e2e_sum = metric(text, "vllm:e2e_request_latency_seconds_sum", **LAB)
    for name, key in (("vllm:request_queue_time_seconds", "queue_time"),
                      ("vllm:request_prefill_time_seconds", "prefill_time"),
                      ("vllm:request_decode_time_seconds", "decode_time")):
        assert len(hb[key + "_buckets"]) == 21
        assert metric(text, name + "_count", **LAB) == hb[key + "_count"] == hb["e2e_count"] >= 2
        assert metric(text, name + "_bucket", le="7680", **LAB) == hb[key + "_buckets"][-1]
        assert 0 <= metric(text, name + "_sum", **LAB) <= e2e_sum * 1.01, name
    assert metric(text, "vllm:prefix_cache_queries_total", **LAB) >= 2 * len(prompt)
    assert metric(text, "vllm:num_requests_waiting", **LAB) == 0
    promtool_check(text)
    # w1 leaves (its heartbeat gone, as when it expires); w2 takes a job:
    # the counters go on from w1's totals, never back
    before = metric(text, "vllm:prefix_cache_queries_total", **LAB)
    before_ttft = metric(text, ttft + "_count", **LAB)
    w1.stop()
    r.delete(f"{prefix}worker:w1")
    workers("w2")
    # (max_tokens 3: not the result cache's answer to "again")
    c.submit({"id": "third", "prompt_ids": prompt, "max_tokens": 3, "temperature": 0})
    c.events("third")

    def summed(t):
        hb = json.loads(r.get(f"{prefix}worker:w2"))
        got = val(t, "vllm:prefix_cache_queries_total", **LAB)
        n = val(t, ttft + "_count", **LAB)
        assert got is not None and got >= before, "the counter went down"
        assert n is not None and n >= before_ttft, "the histogram went down"
        return (got == before + hb["prefix_hit_tokens"] + hb["prefix_miss_tokens"] > before and
                n == before_ttft + hb.get("ttft_count", 0) > before_ttft)
    wait_page(f, summed, "the counter did not go on from the departed worker's totals")


def dashboard_metrics(dash):
    """Every metric name the dashboard's PromQL names (panels' targets and
    the template variables' queries), and the template variable names."""
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))  # rows hold panels
    walk(dash["panels"])
    variables = set()
    for v in dash.get("templating", {}).get("list", []):
        variables.add(v["name"])
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v["type"] == "query" and q:
            exprs.append(q)
    assert exprs, "no PromQL in the dashboard"
    functions = {"histogram_quantile", "rate", "irate", "increase", "sum", "avg", "max", "min",
                 "count", "label_values", "by", "without", "on", "ignoring", "and", "or",
                 "unless", "offset", "clamp_min", "clamp_max", "topk", "bottomk", "delta",
                 "deriv", "abs", "vector", "scalar", "time"}
    names = set()
    for e in exprs:
        e = re.sub(r'"(?:[^"\\]|\\.)*"', "", e)           # strings
        e = re.sub(r"\{[^}]*\}", "", e)                    # label matchers
        e = re.sub(r"\[[^\]]*\]", "", e)                   # ranges
        e = re.sub(r"\b(by|without)\s*\([^)]*\)", "", e)   # groupings
        e = re.sub(r"label_values\(([^,)]*),[^)]*\)", r"(\1)", e)  # its label argument
        e = re.sub(r"\$\w+", "", e)                        # variables
        for tok in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
            if tok not in functions:
                names.add(tok)
    return names, variables


def test_dashboard_metrics_exist(front, workers):  # noqa: F811
    """Every metric the shipped dashboard queries is one of vLLM's names and
    is on the front door's page with the model the $model_name variable
    lists, after requests over HTTP (chat, streamed chat, completion)."""
    dash = json.loads(DASHBOARD.read_text())
    names, variables = dashboard_metrics(dash)
    assert "model_name" in variables and "DS_PROMETHEUS" in variables
    assert len(names) >= 10 and all(n.startswith("vllm:") for n in names), names
    # the inter-token latency and the two length heatmaps, as vLLM's dashboard has them
    assert {"vllm:time_per_output_token_seconds_bucket", "vllm:request_prompt_tokens_bucket",
            "vllm:request_generation_tokens_bucket"} <= names, names
    # and vLLM's "Queue time" and "Requests prefill and decode time" panels
    assert {"vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
            "vllm:request_decode_time_seconds_sum"} <= names, names
    for p in dash["panels"]:
        for t in p["targets"]:
            assert 'model_name="$model_name"' in t["expr"], t["expr"]
    f = front()
    workers("w1")
    msgs = [{"role": "user", "content": "Hi"}]
    for body in ({"model": MODEL_NAME, "messages": msgs, "max_tokens": 3, "mode": "no_think"},
                 {"model": MODEL_NAME, "messages": msgs, "max_tokens": 3, "stream": True}):
        status, _, data = f.request("POST", "/v1/chat/completions", body)
        assert status == 200, data
    status, _, data = f.request("POST", "/v1/completions",
                                {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 3})
    assert status == 200, data
    # the latency histograms are the workers' (heartbeats): all 3 once
    # the heartbeat after the last one came
    text = wait_page(f, lambda t: (val(t, "vllm:prefix_cache_queries_total", **LAB) or 0) > 0
                     and val(t, "vllm:e2e_request_latency_seconds_count", **LAB) == 3,
                     "the fleet's figures never came")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[^{ ]+", line).group(0)
            samples.setdefault(name, []).append(line)
    missing = [n for n in sorted(names)
               if not any(f'model_name="{MODEL_NAME}"' in s for s in samples.get(n, []))]
    assert not missing, f"the dashboard queries metrics the front door lacks: {missing}"
    assert metric(text, "vllm:e2e_request_latency_seconds_count", **LAB) == 3
    assert metric(text, "vllm:request_prompt_tokens_count", **LAB) == 3
    assert metric(text, "vllm:request_generation_tokens_count", **LAB) == 3
    assert metric(text, "vllm:request_queue_time_seconds_count", **LAB) == 3
    assert metric(text, "vllm:request_decode_time_seconds_count", **LAB) == 3
    promtool_check(text)


def listening(port, table):
    """The local addresses (hex, as /proc/net/tcp* writes them) listening
    on port."""
    try:
        lines = pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]
    except OSError:
        return set()
    out = set()
    for ln in lines:
        cols = ln.split()
        addr, p = cols[1].rsplit(":", 1)
        if int(p, 16) == port and cols[3] == "0A":  # TCP_LISTEN
            out.add(addr)
    return out


def scrape(host, port):
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def ipv6_loopback():
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::1", 0))
        s.close()
        return True
    except OSError:
        return False


def test_worker_metrics_bind(workers, redis_addr, prefix, tmp_path):
    """metrics_bind = 0.0.0.0: the worker listens on the wildcard address
    (/proc/net/tcp) and answers /metrics through 127.0.0.1; the default
    stays on loopback; :: answers through ::1; a bad address is refused at
    start, naming the option."""
    port = free_port()
    workers("w1", "--http-port", str(port), "--metrics-bind", "0.0.0.0")
    assert listening(port, "tcp") == {"00000000"}
    assert "redlm_running" in scrape("127.0.0.1", port)
    port2 = free_port()
    workers("w2", "--http-port", str(port2))
    assert listening(port2, "tcp") == {"0100007F"}  # 127.0.0.1, the default
    assert "redlm_running" in scrape("127.0.0.1", port2)
    if ipv6_loopback():
        port3 = free_port()
        workers("w3", "--http-port", str(port3), "--metrics-bind", "::")
        assert listening(port3, "tcp6") == {"0" * 32}
        assert "redlm_running" in scrape("[::1]", port3)
    out = subprocess.run([str(WORKER), "--redis", redis_addr, "--prefix", prefix, "--model",
                          str(MODEL), "--http-port", str(free_port()), "--metrics-bind",
                          "example.com"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert 'metrics_bind: "example.com" is not an IPv4 or IPv6 address' in out.stderr
