"""The reservation replay (``benchmarks/reservation_sim``, small size) and the rules it shares with the scheduler
(``dra.windows.free_by_start``, ``dra.windows.may_use_held``)."""
from __future__ import annotations

from benchmarks.reservation_sim import SMALL, Replay, Shape
from dra import windows

START, END, MARGIN = 1000.0, 2000.0, 6.0


def test_each_window_starts_on_time_on_a_busy_fleet_and_its_idle_capacity_is_lent():
    out = Replay(Shape(**{**SMALL.__dict__, "load": 1.1})).run()
    assert len(out["days"]) == SMALL.days
    for day in out["days"]:
        assert day["held"] == SMALL.reserved and not day["short"]
        assert day["busy_before"] >= 0.9
        assert day["late"] is not None and day["late"] <= 5
    assert 0 < out["lent_inside_gpu_hours"] <= out["idle_gpu_hours"]
    assert out["lent_before_gpu_hours"] > 0


def test_without_lend_idle_nothing_is_lent_inside_the_window():
    out = Replay(Shape(**{**SMALL.__dict__, "load": 1.1, "days": 1, "lend_idle": False})).run()
    assert out["lent_inside_gpu_hours"] == 0
    assert out["days"][0]["late"] is not None and out["days"][0]["late"] <= 5


def test_a_running_claim_counts_free_for_a_hold_only_when_its_walltime_ends_a_margin_before_the_start():
    assert windows.free_by_start(994.0, START, MARGIN)
    assert not windows.free_by_start(994.1, START, MARGIN)
    assert not windows.free_by_start(None, START, MARGIN)  # no walltime: it may run for ever


def test_who_may_land_on_held_capacity():
    # Before the start (in the lead time): ending, with the margin, by the start.
    assert windows.may_use_held([100.0], 894.0, MARGIN, START, END, lend_idle=False)
    assert not windows.may_use_held([100.0], 894.1, MARGIN, START, END, lend_idle=True)
    assert not windows.may_use_held([None], 0.0, MARGIN, START, END, lend_idle=True)
    assert not windows.may_use_held([100.0, None], 0.0, MARGIN, START, END, lend_idle=True)
    assert not windows.may_use_held([], 0.0, MARGIN, START, END, lend_idle=True)
    # Inside the window: only with lendIdle, ending by the end, and while none of its own claims waits.
    assert not windows.may_use_held([100.0], 1500.0, MARGIN, START, END, lend_idle=False)
    assert windows.may_use_held([494.0], 1500.0, MARGIN, START, END, lend_idle=True)
    assert not windows.may_use_held([494.1], 1500.0, MARGIN, START, END, lend_idle=True)
    assert not windows.may_use_held([100.0], 1500.0, MARGIN, START, END, lend_idle=True, own_waiting=True)
