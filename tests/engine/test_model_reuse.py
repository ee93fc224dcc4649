"""An engine built over the models of the engine it replaces (``Engine(..., reuse=...)``): the clusters whose
inventory object is unchanged keep their models, renumbered; the result is the engine a fresh build gives."""
from __future__ import annotations

import random

from dra.engine import AllocatedDevice, Engine, FleetSnapshot

from .builders import claim, cluster, device_class, gpus, group, picked, request


def _fleet(rng: random.Random, names: list[str]) -> dict:
    return {name: cluster(name, {f"{name}-n{i}": gpus(rng.randint(0, 4)) for i in range(rng.randint(1, 4))})
            for name in names}


def _place_all(engine: Engine, n: int) -> list:
    out = []
    for i in range(n):
        outcome = engine.allocate(group(claim(f"c{i}", [request("r", count=1 + i % 2)])), raise_errors=False)
        out.append(picked(outcome) if outcome.allocated else outcome.reason)
    return out


def test_unchanged_clusters_keep_their_models_and_the_engine_equals_a_fresh_one():
    classes = [device_class()]
    for seed in range(30):
        rng = random.Random(seed)
        names = ["a", "b", "c", "d"]
        first = _fleet(rng, names)
        old = Engine(FleetSnapshot([first[n] for n in names], classes))
        # One cluster pushes new slices (a new ClusterInventory object), one goes, one is added; the rest stay.
        changed = rng.choice(names)
        second = dict(first)
        second.update(_fleet(rng, [changed]))
        gone = rng.choice([n for n in names if n != changed])
        del second[gone]
        second.update(_fleet(rng, ["e"]))
        snapshot = FleetSnapshot([second[n] for n in sorted(second)], classes)
        kept = {n: old.clusters[n] for n in second if n in old.clusters and n != changed}
        devices = [d for d in old.devices if d.cluster in second]
        used = [AllocatedDevice(d.cluster, d.driver, d.pool, d.name) for d in rng.sample(devices, len(devices) // 3)]
        reused = Engine(snapshot, used, reuse=old.clusters)
        fresh = Engine(snapshot, used)
        for name, model in kept.items():
            assert reused.clusters[name] is model, (seed, name)
        assert reused.clusters[changed] is not old.clusters[changed]
        assert [(d.idx, d.cluster, d.name) for d in reused.devices] == [(d.idx, d.cluster, d.name)
                                                                          for d in fresh.devices]
        assert all(reused.devices[i].idx == i for i in range(len(reused.devices)))
        assert bytes(reused.excl) == bytes(fresh.excl) and bytes(reused.avail) == bytes(fresh.avail)
        assert _place_all(reused, 12) == _place_all(fresh, 12), seed


def test_a_model_built_with_other_features_is_not_reused():
    from dra.engine import Features

    inv = cluster("a", {"n": gpus(2)})
    old = Engine(FleetSnapshot([inv], [device_class()]))
    other = Engine(FleetSnapshot([inv], [device_class()]), features=Features(partitionable_devices=False),
                   reuse=old.clusters)
    assert other.clusters["a"] is not old.clusters["a"]
    same = Engine(FleetSnapshot([inv], [device_class()]), reuse=old.clusters)
    assert same.clusters["a"] is old.clusters["a"]


def test_a_disposed_engine_leaves_no_cyclic_garbage_and_the_new_one_works():
    """A worker keeps its engine frozen out of the collector's sight; the engine an inventory push replaces
    is disposed of (its cycles broken) so that reference counting frees it, instead of a full collection of
    everything (over a second at 40,000 devices)."""
    import gc

    classes = [device_class()]
    first = {n: cluster(n, {f"{n}-n{i}": gpus(4) for i in range(3)}) for n in ("a", "b")}
    second = dict(first, b=cluster("b", {f"b-n{i}": gpus(2) for i in range(2)}))
    snapshot = FleetSnapshot([second[n] for n in sorted(second)], classes)
    gc.collect()
    gc.disable()
    try:
        old = Engine(FleetSnapshot([first[n] for n in sorted(first)], classes))
        old.build_cel_views()
        _place_all(old, 6)  # plans, selector indexes, node candidates: the caches a worker's engine fills
        new = Engine(snapshot, reuse=old.clusters)
        old.dispose(keep=new.clusters.values())
        del old
        assert gc.collect() == 0
        assert _place_all(new, 6) == _place_all(Engine(snapshot), 6)
    finally:
        gc.enable()
