"""Grouped selector evaluation (dra/engine/partition.py): one evaluation per group of devices that a selector set
cannot tell apart, and key indexes shared by the sets that choose the same devices. Nothing may change: the same
devices match (or fail) as when every device is evaluated, the same claims get the same devices, the cost budget
still stops an expensive selector, and the per-selector state stays bounded."""
from __future__ import annotations

import gc
import json
import os
import random

import pytest

from benchmarks.engine_bench import claim as bench_claim
from benchmarks.engine_bench import exact, gpu_fleet
from dra.cel import CELCompileError, CostBudgetExhausted, CostMeter, SelectorCache, metered
from dra.engine import ClaimGroup, ClusterInventory, Engine, FleetSnapshot, memory, partition, selector_state
from dra.engine.selectors import NO_MATCH, SelectorFailure, SelectorSet

from .builders import claim, cluster, device, engine, group, request

COMMIT = '"commit-{:08x}" != ""'


def _real_engine(shared_dir) -> Engine:
    with open(os.path.join(shared_dir, "fixtures", "real-slices.json")) as fh:
        slices = json.load(fh)
    nodes = sorted({s["spec"]["nodeName"] for s in slices if s["spec"].get("nodeName")})
    inv = ClusterInventory("real", nodes=[{"name": n, "labels": {}} for n in nodes], resource_slices=slices)
    return Engine(FleetSnapshot([inv], []))


def _answer(result) -> object:
    """What the search sees of one device: a match, no match, or the CEL error it would report."""
    if isinstance(result, SelectorFailure):
        return ("error", result.origin, result.index, str(result.error))
    return result is not NO_MATCH


def _selector_sets(shared_dir):
    with open(os.path.join(shared_dir, "fixtures", "real-cel.json")) as fh:
        texts = [entry["expression"] for entry in json.load(fh)]
    rng = random.Random(14)
    # Each real selector alone (as a class selector and as a request selector with a commit id), and random
    # pairs: a class selector followed by a request selector, as the engine combines them.
    sets = [((t,), ()) for t in texts] + [((), (f"({t}) && {COMMIT.format(i)}",)) for i, t in enumerate(texts)]
    sets += [((rng.choice(texts),), (rng.choice(texts),)) for _ in range(60)]
    return sets


def test_grouped_choice_is_the_per_device_answer_on_real_slices(shared_dir):
    e = _real_engine(shared_dir)
    cl = e.clusters["real"]
    devices = partition.usable_devices(e, cl)
    assert len(devices) > 200
    grouped = 0
    for class_exprs, request_exprs in _selector_sets(shared_dir):
        try:
            sel = SelectorSet(("k", class_exprs, request_exprs), "cls", class_exprs, request_exprs, e.cel_cache,
                              True, len(e.devices))
        except CELCompileError:
            continue
        # Per device, from a cold memo: what the engine did before grouping.
        alone = SelectorSet(sel.key, "cls", class_exprs, request_exprs, SelectorCache(), True, len(e.devices))
        per_device = {d.idx: _answer(alone.evaluate(d)) for d in devices}
        part = partition.build(e, sel, cl)
        if part is None:
            continue
        grouped += 1
        assert sorted(d.idx for g in part.groups for d in g) == sorted(per_device)
        for g in part.groups:  # a group is alike for the set: its first device answers for all
            assert {per_device[d.idx] for d in g} == {_answer(sel.evaluate(g[0]))}
        members = {d.idx for d in part.members(part.chosen(sel))}
        # A device whose selectors fail at run time does not match (dra.engine.selectors).
        assert members == {i for i, a in per_device.items() if a is True}
    assert grouped >= 100  # most real selectors read a few attributes: grouping is the common path


def _trace(e: Engine, seed: int, steps: int) -> list:
    """Random 1-4 GPU claims (soak-style texts: a commit id in an always-true clause, a numa or index choice,
    or none) with releases; the devices each gets."""
    rng = random.Random(seed)
    held, answers = [], []
    for i in range(steps):
        if rng.random() < 0.35 and held:
            e.release(held.pop(rng.randrange(len(held))))
            continue
        kind = rng.random()
        if kind < 0.2:
            sel = None
        elif kind < 0.5:
            sel = [f'device.attributes["gpu.example.com"].numa == {rng.randrange(4)} && {COMMIT.format(i)}']
        else:
            sel = [f'device.attributes["gpu.example.com"].index >= {rng.randrange(8)} && {COMMIT.format(i)}']
        out = e.allocate(ClaimGroup(key=f"c{i}", claims=[bench_claim(f"c{i}", [exact("gpu", "gpu",
                                                                                     rng.randrange(1, 5), sel)])]))
        if out.allocated:
            held.append(out.devices)
        answers.append(sorted((d.pool, d.device) for d in out.devices) if out.allocated else out.reason)
    return answers


def test_same_devices_as_per_device_evaluation(monkeypatch):
    grouped = Engine(gpu_fleet(30, 8))
    answers = _trace(grouped, 7, 500)
    assert grouped.selector_stats()["shared_indexes"] > 100  # the trace did share indexes
    assert any(isinstance(a, str) for a in answers) and any(isinstance(a, list) for a in answers)
    monkeypatch.setattr(partition, "max_groups", lambda devices: 0)  # every set evaluated per device
    alone = Engine(gpu_fleet(30, 8))
    assert _trace(alone, 7, 500) == answers
    assert alone.selector_stats()["shared_indexes"] == 0


def test_new_texts_share_one_index_and_the_state_stays_bounded(monkeypatch):
    monkeypatch.setattr(selector_state, "MAX_PARTITIONS", 8)
    e = Engine(gpu_fleet(20, 8), max_selector_sets=16, max_key_indexes=8)
    for i in range(100):  # one footprint, one choice: every text after the first reuses the index
        out = e.allocate(ClaimGroup(key=f"s{i}", claims=[bench_claim(f"s{i}", [exact("gpu", "gpu", 1, [
            f'device.attributes["gpu.example.com"].index >= 0 && {COMMIT.format(i)}'])])]))
        e.release(out.devices)
    stats = e.selector_stats()
    assert stats["key_indexes"] == 1 and stats["shared_indexes"] == 99 and stats["partitions"] == 1
    for i in range(100):  # a new footprint each (a different attribute name): a partition each, evicted
        sel = [f'!has(device.attributes["gpu.example.com"].a{i}) && {COMMIT.format(i)}']
        out = e.allocate(ClaimGroup(key=f"f{i}", claims=[bench_claim(f"f{i}", [exact("gpu", "gpu", 1, sel)])]))
        assert out.allocated
        e.release(out.devices)
    stats = e.selector_stats()
    assert stats["partitions"] <= 8 and stats["key_indexes"] <= 8 and stats["selector_sets"] <= 16


EXPENSIVE = '[{}].exists(i, device.attributes["gpu.example.com"].uuid == string(i))'.format(
    ",".join(str(n) for n in range(300)))


@pytest.mark.parametrize("devices", [40, 200])  # grouped (a group per uuid) and per device (too many groups)
def test_the_cost_budget_still_stops_an_expensive_selector(devices):
    nodes = {f"n{n}": [device(f"gpu-{g}", uuid=f"GPU-{n}-{g}") for g in range(4)] for n in range(devices // 4)}
    e = engine(cluster("c1", nodes))
    sel = SelectorCache().compiled(EXPENSIVE)
    assert sel.footprint is not None  # reads one attribute: grouped when the uuids allow it
    meter = CostMeter(20 * 301 * 10)  # about 20 evaluations of the full list
    with metered(meter), pytest.raises(CostBudgetExhausted):
        e.allocate(group(claim("hostile", [request("r", selectors=[EXPENSIVE])])))
    assert 5 < meter.evaluations < 40
    # Alike devices: the same selector is evaluated once per group, within the same budget.
    alike = engine(cluster("c1", {f"n{n}": [device(f"gpu-{g}", uuid="GPU-0") for g in range(4)]
                                  for n in range(devices // 4)}))
    meter = CostMeter(20 * 301 * 10)
    with metered(meter):
        assert not alike.allocate(group(claim("cheap", [request("r", selectors=[EXPENSIVE])]))).allocated
    assert meter.evaluations <= 2


def test_a_frozen_engine_has_its_cel_views_frozen_too(monkeypatch):
    """The worker freezes its engine out of the collector's sight; the CEL views that the first selector builds
    for every device must be frozen with it, or each full collection rescans ~10 objects per device."""
    monkeypatch.setattr(memory, "_tuned", True)  # leave this process's collector thresholds alone
    monkeypatch.setattr(memory, "_freezing", False)  # and do not leave it freezing after this test
    monkeypatch.setattr(memory, "_engine_frozen", False)
    e = Engine(gpu_fleet(250, 8))  # 2,000 devices
    memory.freeze_long_lived(e)
    try:
        gc.collect()
        before = len(gc.get_objects())
        sel = [f'device.attributes["gpu.example.com"].numa == 1 && {COMMIT.format(1)}']
        out = e.allocate(ClaimGroup(key="g", claims=[bench_claim("g", [exact("gpu", "gpu", 1, sel)])]))
        e.release(out.devices)
        gc.collect()
        grown = len(gc.get_objects()) - before
    finally:
        memory.release_frozen()
    # The text's own objects (its compiled program, plan, selector set), not some per device: built after the
    # freeze, the CEL views were over 10,000 objects here.
    assert grown < len(e.devices) / 2
