"""Planned starts (``dra.engine.timeline``): each waiting group starts at the first running end (or now) where
it fits beside what the groups before it were promised, and the engine is handed back untouched."""
from __future__ import annotations

from dra.engine import AllocatedDevice
from dra.engine.timeline import Ending, Waiting, plan_starts

from .builders import DRIVER, claim, cluster, engine, gpus, group, request


def dev(node: str, i: int) -> AllocatedDevice:
    return AllocatedDevice("c1", DRIVER, node, f"gpu-{i}")


def running_fleet():
    """One node of 4 GPUs: gpu-0..1 end at 100, gpu-2 at 200, gpu-3 never."""
    used = [dev("n1", i) for i in range(4)]
    return engine(cluster("c1", {"n1": gpus(4)}), allocated=used), [
        Ending(100.0, (dev("n1", 0), dev("n1", 1))), Ending(200.0, (dev("n1", 2),))]


def wants(name: str, n: int):
    return group(claim(name, [request("gpu", count=n)]), key=name)


def test_each_group_starts_at_the_first_end_where_it_fits_beside_earlier_promises():
    e, ends = running_fleet()
    out = plan_starts(e, ends, [Waiting(wants("head", 3), 50.0), Waiting(wants("short", 1), 60.0),
                                Waiting(wants("long", 1), 500.0), Waiting(wants("four", 4), 10.0)], now=0.0)
    head, short, long_, four = out
    assert head is not None and (head.start, head.end, head.node) == (200.0, 250.0, "n1")
    assert sorted(d.device for d in head.devices) == ["gpu-0", "gpu-1", "gpu-2"]
    # Fits in the gap before the head starts (100 + 60 <= 200): backfill, planned.
    assert short is not None and short.start == 100.0 and short.end == 160.0
    # 500 s from 100 would overlap the head: it waits for the head's end.
    assert long_ is not None and long_.start == 250.0
    assert four is None  # gpu-3 never ends


def test_the_engine_is_handed_back_as_it_was_given():
    e, ends = running_fleet()
    plan_starts(e, ends, [Waiting(wants("head", 3), 50.0), Waiting(wants("x", 1), None)], now=0.0)
    assert not e.allocate(wants("probe", 1)).allocated  # all four still in use
    e.release([dev("n1", 3)])
    assert e.allocate(wants("probe", 1)).allocated


def test_a_group_that_never_ends_holds_its_devices_for_every_later_candidate():
    e, ends = running_fleet()
    first, second = plan_starts(e, ends, [Waiting(wants("forever", 2), None), Waiting(wants("next", 2), 5.0)],
                                now=0.0)
    assert first is not None and first.start == 100.0 and first.end is None
    assert second is None  # one device ends at 200, gpu-3 never: two are never free beside "forever"


def test_many_ends_are_thinned_to_the_candidate_limit_never_earlier_than_the_true_start():
    used = [dev("n1", i) for i in range(8)]
    e = engine(cluster("c1", {"n1": gpus(8)}), allocated=used)
    ends = [Ending(float(10 * (i + 1)), (dev("n1", i),)) for i in range(8)]
    (exact,) = plan_starts(e, ends, [Waiting(wants("three", 3), 1.0)], now=0.0)
    (thin,) = plan_starts(e, ends, [Waiting(wants("three", 3), 1.0)], now=0.0, max_candidates=3)
    assert exact is not None and exact.start == 30.0
    assert thin is not None and thin.start >= 30.0


def test_a_group_whose_search_spends_its_cel_budget_is_left_unplanned_and_the_rest_go_on():
    e, ends = running_fleet()
    nested = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20].all(x, [1,2,3,4,5,6,7,8,9,10].all(y, x + y > 0))"
    costly = group(claim("costly", [request("gpu", selectors=[nested])]), key="costly")  # ~1,900 units a device
    out = plan_starts(e, ends, [Waiting(costly, 50.0), Waiting(wants("cheap", 1), 50.0)], now=0.0, budget=500)
    assert out[0] is None  # every candidate time shares one budget: spent at the first device it reads
    assert out[1] is not None and out[1].start == 100.0  # the next group is planned as if it were alone
    assert not e.allocate(wants("probe", 1)).allocated  # and the engine is handed back untouched
    (again,) = plan_starts(e, ends, [Waiting(costly, 50.0)], now=0.0)  # without a budget it is planned
    assert again is not None and again.start == 100.0
