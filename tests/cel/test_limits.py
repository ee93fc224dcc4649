"""Hostile input is bounded: length, nesting, and a per-evaluation cost and time budget."""
import threading
import time

import pytest

from dra.cel import (
    MAX_EXPRESSION_LENGTH,
    MAX_NESTING_DEPTH,
    CELBudgetExceeded,
    CELCompileError,
    CELDevice,
    CELRuntimeError,
    SelectorCache,
    compile_expression,
)

DEVICE = CELDevice("d.example.com", {"s": {"string": "a" * 60}})
TEN = "[" + ",".join(str(i) for i in range(10)) + "]"
# 10^7 innermost evaluations: would take hours in cel-python without a budget.
RUNAWAY = (f"{TEN}.all(a, {TEN}.all(b, {TEN}.all(c, {TEN}.all(d, {TEN}.all(e, {TEN}.all(f, {TEN}.all(g, "
           "a + b + c + d + e + f + g >= 0)))))))")


def test_runaway_expression_is_stopped_by_the_default_budget():
    start = time.perf_counter()
    with pytest.raises(CELBudgetExceeded) as info:
        compile_expression(RUNAWAY).evaluate(DEVICE)
    elapsed = time.perf_counter() - start
    assert "actual cost limit exceeded" in info.value.reason
    assert elapsed < 5, f"budget did not stop the evaluation quickly ({elapsed:.1f} s)"
    assert isinstance(info.value, CELRuntimeError)


def test_cost_limit_is_counted_not_timed():
    # A small cost limit trips long before any clock check could; deterministic.
    start = time.perf_counter()
    with pytest.raises(CELBudgetExceeded, match=r"more than 5000 cost units"):
        compile_expression(RUNAWAY).evaluate(DEVICE, cost_limit=5000, time_limit=60)
    assert time.perf_counter() - start < 10  # a bound, not a benchmark


def test_time_limit_stops_evaluation():
    start = time.perf_counter()
    with pytest.raises(CELBudgetExceeded, match=r"ran longer than 0.05 s"):
        compile_expression(RUNAWAY).evaluate(DEVICE, cost_limit=10**12, time_limit=0.05)
    assert time.perf_counter() - start < 5  # a bound, not a benchmark


def test_budget_error_is_not_absorbed_by_a_false_operand():
    # CEL's `error || true` is true, but a budget stop aborts the whole evaluation.
    with pytest.raises(CELBudgetExceeded):
        compile_expression(f"({RUNAWAY}) || true").evaluate(DEVICE, cost_limit=5000)
    # Short-circuit from the left still avoids the work entirely.
    assert compile_expression(f"false && ({RUNAWAY})").evaluate(DEVICE, cost_limit=5000) is False


def test_list_building_is_charged():
    blowup = f"{TEN}.map(a, {TEN}.map(b, {TEN}.map(c, {TEN}.map(d, {TEN}.map(e, {TEN}))))).size() > 0"
    with pytest.raises(CELBudgetExceeded):
        compile_expression(blowup).evaluate(DEVICE, cost_limit=100_000)


def test_catastrophic_regex_runs_in_linear_time():
    # (a+)+$ against "aaaa...!" takes exponential time with a backtracking engine.
    text = '"' + "a" * 5000 + '!"'
    start = time.perf_counter()
    assert compile_expression(f'{text}.matches("(a+)+$")').evaluate(DEVICE) is False
    expr = 'device.attributes["d.example.com"].s.matches("^(a|aa)+$")'
    assert compile_expression(expr).evaluate(DEVICE) is True
    assert time.perf_counter() - start < 5  # a bound, not a benchmark


def test_budget_exceeded_is_memoised_like_any_error():
    cache = SelectorCache()
    with pytest.raises(CELBudgetExceeded):
        cache.evaluate(RUNAWAY, DEVICE)
    start = time.perf_counter()
    with pytest.raises(CELBudgetExceeded):
        cache.evaluate(RUNAWAY, DEVICE)
    assert time.perf_counter() - start < 1.0  # a bound, not a benchmark
    assert cache.stats()["evaluations"] == 1


def test_expression_length_limit():
    body = 'device.driver == "' + "x" * (MAX_EXPRESSION_LENGTH - 20) + '"'
    body = body + " " * (MAX_EXPRESSION_LENGTH - len(body))
    assert len(body) == MAX_EXPRESSION_LENGTH
    assert compile_expression(body).evaluate(DEVICE) is False
    with pytest.raises(CELCompileError, match=r"more than the limit of 10240"):
        compile_expression(body + " ")


def test_nesting_limit():
    ok = "(" * MAX_NESTING_DEPTH + "true" + ")" * MAX_NESTING_DEPTH
    assert compile_expression(ok).evaluate(DEVICE) is True
    too_deep = "(" * (MAX_NESTING_DEPTH + 1) + "true" + ")" * (MAX_NESTING_DEPTH + 1)
    with pytest.raises(CELCompileError, match=r"nests 65 levels deep, more than the limit of 64"):
        compile_expression(too_deep)


@pytest.mark.parametrize("prefix,suffix", [("(", ")"), ("[", "][0]"), ("!", ""), ("-", ""), ("string(", ")")])
def test_deeply_nested_input_is_rejected_without_recursion_error(prefix, suffix):
    n = MAX_EXPRESSION_LENGTH // (len(prefix) + len(suffix) + 1)
    with pytest.raises(CELCompileError, match="nests"):
        compile_expression(prefix * n + "1" + suffix * n)


def test_expression_at_the_nesting_limit_evaluates_in_a_worker_thread():
    # Worker threads have the same recursion limit; the deepest accepted expression of every
    # shape must evaluate there without RecursionError.
    shapes = {
        "ternary": lambda d: f"(true ? {d} : false)",
        "index": lambda d: f"[{d}][0]",
        "call": lambda d: f"bool(string({d}))",
        "macro": lambda d: f"[{d}].all(x, x)",
    }
    results = {}

    def work():
        for name, wrap in shapes.items():
            expr = "true"
            while True:
                candidate = wrap(expr)
                try:
                    compile_expression(candidate)
                except CELCompileError:
                    break
                expr = candidate
            results[name] = compile_expression(expr).evaluate(DEVICE)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results == {name: True for name in shapes}


def test_long_or_chain_is_not_limited_by_nesting():
    expr = " || ".join(f'device.driver == "x{i}.io"' for i in range(300)) + ' || device.driver == "d.example.com"'
    assert len(expr) < MAX_EXPRESSION_LENGTH
    compiled = compile_expression(expr)
    assert compiled.evaluate(DEVICE) is True
    assert len(compiled.drivers) == 301
