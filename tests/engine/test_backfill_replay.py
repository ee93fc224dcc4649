"""The walltime backfill replay (``benchmarks/backfill_sim``, small size): the shared rule
(``dra.engine.timeline.may_backfill``) lets claims into held nodes without delaying a head, and fewer of the
held nodes' GPUs sit idle than with space-only holds."""
from __future__ import annotations

from benchmarks.backfill_sim import SMALL, compare
from dra.engine.timeline import may_backfill


def test_backfill_fills_held_nodes_and_delays_no_head():
    out = compare(SMALL)
    before, after = out["before"], out["after"]
    assert before["backfilled"] == 0 and after["backfilled"] > 0
    assert before["held_gpu_rounds"] > 0
    assert after["delayed"] == 0
    assert after["idle"] < before["idle"]


def test_the_rule_counts_the_margin_and_refuses_claims_without_walltime():
    assert may_backfill([60.0], now=100.0, margin=6.0, protected=[166.0])
    assert not may_backfill([60.0], now=100.0, margin=6.0, protected=[165.9, 500.0])
    assert may_backfill([60.0], now=100.0, margin=6.0, protected=[])  # takes no promised device
    assert not may_backfill([None], now=100.0, margin=6.0, protected=[])
    assert not may_backfill([60.0, None], now=100.0, margin=6.0, protected=[1e9])
    assert not may_backfill([], now=100.0, margin=6.0, protected=[])
