"""A CEL runtime error on one device is that device's, not the claim's (dra.engine.selectors).

Upstream fails the Filter with the error; fleet-wide one cluster's odd device (here a GPU that publishes no
``type`` attribute) would fail every claim of every tenant that reaches it. Here the device does not match, the
failure diagnostics count and name the error, and a claim whose every candidate fails waits with
``selector_error_on_all_candidates`` instead of an input error.
"""
from __future__ import annotations

import pytest

from dra.engine import AllocationError, Reason

from .builders import claim, cluster, device, device_class, engine, group, request

pytestmark = pytest.mark.pure

TYPED = 'device.attributes["gpu.example.com"].type == "a100"'


def fleet(good_gpus: int = 2):
    good = cluster("good", {"g-node": [device(f"gpu-{i}", type="a100") for i in range(good_gpus)]})
    rogue = cluster("rogue", {"r-node": [device("gpu-0")]})  # no attributes at all
    return good, rogue


def test_class_selector_failing_on_a_rogue_device_leaves_the_others_allocatable():
    e = engine(*fleet(), classes=[device_class(expr=TYPED)])
    first = e.allocate(group(claim("a", [request("r", count=2)])))
    assert first.allocated and first.cluster == "good"
    # The good devices are taken: the next claim waits (unsatisfiable), it does not fail with the rogue's error.
    waiting = e.allocate(group(claim("b", [request("r")])))
    assert not waiting.allocated and waiting.error is None and waiting.reason == Reason.UNSATISFIABLE
    req = waiting.diagnostics["requests"][0]
    assert req["dropped"] == {"allocated": 2, "cel_error": 1}
    assert req["selector_errors"] == [{
        "origin": "class", "deviceClassName": "gpu", "selector": 0, "error": "no such key: type",
        "cluster": "rogue", "devices": 1, "driver": "gpu.example.com", "pool": "r-node", "device": "gpu-0"}]
    assert "no such key: type" in waiting.message


def test_a_claim_whose_only_candidates_fail_waits_with_its_own_reason():
    good, rogue = fleet()
    e = engine(good, rogue)  # the class selects by driver only: the rogue device is a candidate
    h100 = claim("c", [request("r", selectors=['device.attributes["gpu.example.com"].type == "h100"'])])
    out = e.allocate(group(h100))
    assert not out.allocated and out.error is None
    assert out.reason == Reason.SELECTOR_ERROR_ON_ALL_CANDIDATES == out.diagnostics["reason"]
    req = out.diagnostics["requests"][0]
    assert req["dropped"] == {"request_selector": 2, "cel_error": 1}
    assert [(s["origin"], s["cluster"], s["devices"]) for s in req["selector_errors"]] == [("claim", "rogue", 1)]
    # Pinned to the rogue node (as the kube-scheduler Filter for one node): still a wait, not an error.
    pinned = e.allocate(group(h100, node="r-node"))
    assert not pinned.allocated and pinned.error is None
    assert pinned.reason == Reason.SELECTOR_ERROR_ON_ALL_CANDIDATES


def test_all_mode_leaves_failing_devices_out_and_a_satisfiable_claim_allocates():
    good = cluster("good", {"n": [device("gpu-0", type="a100"), device("gpu-1")]})
    e = engine(good)
    everything = e.allocate(group(claim("all", [request("r", mode="All", selectors=[TYPED])])))
    assert everything.allocated
    assert [r["device"] for r in everything.claims[0].allocation["devices"]["results"]] == ["gpu-0"]


def test_compile_errors_stay_errors():
    e = engine(*fleet())
    with pytest.raises(AllocationError) as exc:
        e.allocate(group(claim("bad", [request("r", selectors=["device.attributes[ =="])])))
    assert exc.value.code == "cel_error" and "compile error" in exc.value.message
