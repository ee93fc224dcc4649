"""Never exponential: count bounds, symmetry, constraint propagation, and the search budget."""
from __future__ import annotations

import time

import pytest

from dra.cel import compile_expression
from dra.engine import SearchBudget

from .builders import DRIVER, claim, cluster, device, engine, gpus, group, request


@pytest.fixture(autouse=True, scope="module")
def _warm_cel_parser():
    # The CEL grammar tables are built once per process (~0.2 s); timings below are about the search.
    compile_expression("true")


def _131730_engine():
    devices = [device(f"dev-{i}", group="a" if i < 16 else "b") for i in range(32)]
    return engine(cluster("c1", {"node-0": devices}))


def test_kubernetes_131730_is_unsatisfiable_at_once():
    """32 interchangeable devices in two groups of 16; two requests of 9 must share a group: impossible."""
    e = _131730_engine()
    start = time.perf_counter()
    out = e.allocate(group(claim("c", [request("r0", count=9), request("r1", count=9)],
                                 [{"matchAttribute": f"{DRIVER}/group"}])))
    elapsed = time.perf_counter() - start
    assert not out.allocated and out.reason == "unsatisfiable"
    assert elapsed < 1.0  # a bound, not a benchmark: the exhaustive search takes minutes
    assert out.diagnostics["nodes"][0]["reason"] == "constraint"
    assert out.diagnostics["search"]["steps"] == 0  # the bound alone proved it


def test_kubernetes_131730_search_stays_small_without_the_bound():
    """With ``firstAvailable`` the up-front bound does not apply: symmetry keeps the exhaustive search tiny."""
    e = _131730_engine()
    r0 = {"name": "r0", "firstAvailable": [{"name": "only", "deviceClassName": "gpu", "allocationMode": "ExactCount",
                                            "count": 9}]}
    start = time.perf_counter()
    out = e.allocate(group(claim("c", [r0, request("r1", count=9)], [{"matchAttribute": f"{DRIVER}/group"}])))
    assert not out.allocated and out.reason == "unsatisfiable"
    assert time.perf_counter() - start < 1.0  # a bound, not a benchmark (the search without symmetry: minutes)
    # Upstream tries C(16,9) x ... combinations; with symmetry each step has at most two distinct choices.
    assert 0 < out.diagnostics["search"]["steps"] < 200


def test_satisfiable_variant_of_131730_finds_the_group():
    e = _131730_engine()
    out = e.allocate(group(claim("c", [request("r0", count=8), request("r1", count=8)],
                                 [{"matchAttribute": f"{DRIVER}/group"}])))
    assert out.allocated
    # All 16 devices of one group (the first, in allocation order).
    assert sorted(int(d.device.split("-")[1]) for d in out.devices) == list(range(16))


def test_count_bound_fails_without_search():
    e = engine(cluster("c1", {"n1": gpus(4)}))
    out = e.allocate(group(claim("c", [request("r", count=5)]), node="n1"))
    assert not out.allocated
    assert out.diagnostics["search"]["steps"] == 0
    assert out.diagnostics["nodes"][0]["reason"] == "not_enough_devices"
    assert out.diagnostics["nodes"][0]["free"] == 4


def test_unsatisfiable_claim_over_a_large_fleet_is_fast():
    e = engine(cluster("c1", {f"n{i:03d}": gpus(8) for i in range(500)}))
    start = time.perf_counter()
    out = e.allocate(group(claim("big", [request("r", count=9)])))
    assert not out.allocated and time.perf_counter() - start < 0.5
    assert out.diagnostics["requests"][0]["available"] == 4000


def test_search_budget_turns_a_hard_search_into_a_reason():
    # 20 distinct devices that all share the attribute a distinctAttribute constraint needs to differ: every
    # pair is tried and rejected, which takes far more than 10 steps.
    devices = [device(f"d{i}", serial=i, rack="r1") for i in range(20)]
    e = engine(cluster("c1", {"n1": devices}), budget=SearchBudget(max_steps=10))
    out = e.allocate(group(claim("c", [request("r", count=3)], [{"distinctAttribute": f"{DRIVER}/rack"}])))
    assert not out.allocated and out.reason == "search_budget_exceeded"
    assert "search budget exceeded" in out.diagnostics["summary"] or out.message
    # With the default budget the same search completes and proves it impossible.
    e2 = engine(cluster("c1", {"n1": devices}))
    out2 = e2.allocate(group(claim("c", [request("r", count=3)], [{"distinctAttribute": f"{DRIVER}/rack"}])))
    assert out2.reason == "unsatisfiable"


def test_identical_nodes_are_searched_once():
    # Every node fails the same way (distinctAttribute cannot hold); nodes with the same shape are skipped.
    nodes = {f"n{i}": [device(f"d{j}", serial=j, rack="r1") for j in range(4)] for i in range(50)}
    e = engine(cluster("c1", nodes))
    out = e.allocate(group(claim("c", [request("r", count=2)], [{"distinctAttribute": f"{DRIVER}/rack"}])))
    assert not out.allocated
    reasons = [n["reason"] for n in out.diagnostics["nodes"]]
    assert reasons[0] == "no_combination" and set(reasons[1:]) == {"same_as_failed_node"}
