"""The worker says once, at start, how many KV tokens it got and what sized
the pool (issue 25 point 3): the engine's 1 GiB default on the CPU backend,
or kv_budget_mb when given - the tokens in proportion to the budget, and
max_context no larger than what the pool holds."""
import re

LINE = re.compile(r"KV cache: (\d+) tokens \((\d+) blocks of (\d+), sized by (\w+)\), max_context (\d+)")


def kv_line(worker):
    m = LINE.search(worker.text())
    assert m, f"no KV line in the worker's log:\n{worker.text()}"
    tokens, blocks, bs, how, ctx = m.groups()
    assert int(tokens) == int(blocks) * int(bs)
    assert 0 < int(ctx) <= int(tokens)
    return int(tokens), how, int(ctx)


def test_worker_logs_its_kv_tokens(workers):
    t_def, how_def, _ = kv_line(workers("kv1"))
    t_64, how_64, ctx_64 = kv_line(workers("kv2", "--kv-budget-mb", "64"))
    assert how_def == "default"
    assert how_64 == "budget"
    # 64 MiB holds 1/16 of what 1 GiB holds, to the block
    assert abs(t_def - 16 * t_64) <= 16 * 16
    assert ctx_64 <= t_64
