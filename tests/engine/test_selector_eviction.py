"""The engine's per-selector state is bounded and evicting, and eviction never changes an answer."""
from __future__ import annotations

import random

from benchmarks.engine_bench import claim, exact, gpu_fleet
from dra.engine import ClaimGroup, Engine
from dra.engine.index import KeyIndex


def _selector(rng: random.Random, i: int) -> list[str] | None:
    """A mix a CI fleet writes: no selector, a few common ones, and one-off texts (commit ids)."""
    kind = rng.random()
    if kind < 0.3:
        return None
    if kind < 0.6:
        return [f'device.attributes["gpu.example.com"].numa == {rng.randrange(4)}']
    return [f'device.attributes["gpu.example.com"].index >= {rng.randrange(8)} && "{i:08x}" != "x"']


def _trace(seed: int, steps: int):
    rng = random.Random(seed)
    for i in range(steps):
        yield ("release" if rng.random() < 0.35 else "allocate"), rng.randrange(1, 4), _selector(rng, i), rng


def _run(engine: Engine, seed: int, steps: int) -> list:
    held: list = []
    answers = []
    for i, (op, count, selectors, rng) in enumerate(_trace(seed, steps)):
        if op == "release" and held:
            engine.release(held.pop(rng.randrange(len(held))))
            answers.append("released")
            continue
        group = ClaimGroup(key=f"c{i}", claims=[claim(f"c{i}", [exact("gpu", "gpu", count, selectors)])])
        outcome = engine.allocate(group)
        if outcome.allocated:
            held.append(outcome.devices)
            answers.append(sorted((d.pool, d.device) for d in outcome.devices))
        else:
            answers.append(outcome.reason)
    return answers


def test_eviction_never_changes_an_answer():
    """Tiny caps (constant eviction and rebuilding) against caps nothing reaches: the same devices, claim by claim,
    over random traces of allocations, releases and selector churn."""
    for seed in (1, 2, 3):
        small = Engine(gpu_fleet(40, 8), max_selector_sets=3, max_key_indexes=2)
        large = Engine(gpu_fleet(40, 8), max_selector_sets=100_000, max_key_indexes=100_000)
        assert _run(small, seed, 400) == _run(large, seed, 400)
        assert small.selector_stats()["evicted"] > 0 and large.selector_stats()["evicted"] == 0


def test_caps_hold_under_churn():
    engine = Engine(gpu_fleet(20, 8), max_selector_sets=16, max_key_indexes=8)
    for i in range(300):
        sel = [f'device.attributes["gpu.example.com"].index >= 0 && "{i:08x}" != "x"']
        outcome = engine.allocate(ClaimGroup(key=f"c{i}", claims=[claim(f"c{i}", [exact("gpu", "gpu", 1, sel)])]))
        assert outcome.allocated
        engine.release(outcome.devices)
    stats = engine.selector_stats()
    assert stats["selector_sets"] <= 16 and stats["key_indexes"] <= 8
    assert stats["evicted"] >= 300 - 16


def test_a_plain_claim_does_not_pay_for_other_selectors(monkeypatch):
    """Index maintenance per allocation counts only the index the claim uses, not every index the worker keeps."""
    engine = Engine(gpu_fleet(50, 8))
    for i in range(200):
        # 200 distinct choices of devices (GPU indexes by the bits of i + 1), so 200 indexes: sets that choose
        # the same devices share one (test_selector_partition.py).
        chosen = [b for b in range(8) if (i + 1) >> b & 1]
        sel = [f'device.attributes["gpu.example.com"].index in {chosen}']
        outcome = engine.allocate(ClaimGroup(key=f"s{i}", claims=[claim(f"s{i}", [exact("gpu", "gpu", 1, sel)])]))
        engine.release(outcome.devices)
    assert engine.selector_stats()["key_indexes"] > 200 - 5
    plain = ClaimGroup(key="p0", claims=[claim("p0", [exact("gpu", "gpu", 1)])])
    engine.release(engine.allocate(plain).devices)  # the plain index exists and is current

    calls = []
    original = KeyIndex.device_changed
    monkeypatch.setattr(KeyIndex, "device_changed",
                        lambda self, d, delta: (calls.append(self), original(self, d, delta)))
    for i in range(1, 6):
        plain = ClaimGroup(key=f"p{i}", claims=[claim(f"p{i}", [exact("gpu", "gpu", 1)])])
        engine.release(engine.allocate(plain).devices)
    # Each round trip changes one device twice; only the plain claim's own index replays it (before: ~200).
    assert len(calls) <= 2 * 5 + 2
    assert len({id(ki) for ki in calls}) == 1


def test_an_index_behind_the_kept_log_is_rebuilt_with_the_same_answers():
    engine = Engine(gpu_fleet(4, 8))
    numa = [exact("gpu", "gpu", 1, ['device.attributes["gpu.example.com"].numa == 0'])]
    first = engine.allocate(ClaimGroup(key="n0", claims=[claim("n0", numa)]))
    assert first.allocated
    plain = []
    for i in range(3000):  # far more changes than the log keeps for 32 devices
        out = engine.allocate(ClaimGroup(key=f"p{i}", claims=[claim(f"p{i}", [exact("gpu", "gpu", 1)])]))
        if out.allocated:
            plain.append(out.devices)
        if len(plain) > 20:
            engine.release(plain.pop(0))
    again = engine.allocate(ClaimGroup(key="n1", claims=[claim("n1", numa)]))
    fresh = Engine(gpu_fleet(4, 8), allocated=[d for held in plain for d in held] + list(first.devices))
    expected = fresh.allocate(ClaimGroup(key="n1", claims=[claim("n1", numa)]))
    assert again.allocated == expected.allocated
    assert sorted((d.pool, d.device) for d in again.devices) == sorted((d.pool, d.device) for d in expected.devices)
    assert engine.selector_stats()["rebuilt_indexes"] >= 1


def test_failures_of_one_shape_walk_the_cluster_once():
    """A burst of identical claims against a full fleet: the explanation's device counts are made once for the
    shape, and every claim still gets its own name in its explanation. The selector-stage counts (which do not
    depend on what is in use) are made once per selector set and outlive allocations and releases."""
    engine = Engine(gpu_fleet(10, 8))
    fills = [engine.allocate(ClaimGroup(key=f"f{n}", claims=[claim(f"f{n}", [exact("gpu", "gpu", 8)])]))
             for n in range(10)]  # every node full (8 GPUs each)
    assert all(f.allocated for f in fills)
    cache = engine.explained
    outcomes = [engine.allocate(ClaimGroup(key=f"c{i}", claims=[claim(f"c{i}", [exact("gpu", "gpu", 2)])]))
                for i in range(20)]
    assert not any(o.allocated for o in outcomes)
    assert (cache.recounted, cache.walks) == (1, 1)
    for i, o in enumerate(outcomes):
        assert f"c{i}/gpu" in o.diagnostics["summary"] and "80 allocated" in o.diagnostics["summary"]
    engine.allocate(ClaimGroup(key="other", claims=[claim("other", [exact("gpu", "gpu", 1)])]))
    assert (cache.recounted, cache.walks) == (2, 1)  # another shape: its own counts, the same selectors
    engine.allocate(ClaimGroup(key="again", claims=[claim("again", [exact("gpu", "gpu", 2)])]))
    assert cache.recounted == 2  # nothing was allocated or released since: the counts still stand
    engine.release(fills[0].devices)
    big = engine.allocate(ClaimGroup(key="big", claims=[claim("big", [exact("gpu", "gpu", 9)])]))
    assert (cache.recounted, cache.walks) == (3, 1)  # the fleet changed: counted afresh, selectors kept
    assert big.diagnostics["requests"][0]["available"] == 8
