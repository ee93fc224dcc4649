"""The worker's collector policy (dra.engine.memory): what rounds leave alive leaves the collector's generations,
nothing accumulates frozen, and a replaced engine is freed. Behavioural: object counts, no timings."""
from __future__ import annotations

import gc
import weakref

import pytest

from benchmarks.engine_bench import claim, exact, gpu_fleet
from dra.cel import compile_expression
from dra.cel.cache import reset_shared_caches
from dra.engine import ClaimGroup, Engine, memory


@pytest.fixture
def policy(monkeypatch):
    """This test process plays a worker; its thresholds stay as they are and nothing stays frozen after. The
    process-wide CEL caches start empty: full of earlier tests' entries, the new texts would evict (free) some
    that get frozen here, and the frozen count would say less than the rounds kept."""
    compile_expression.cache_clear()
    reset_shared_caches()
    gc.collect()
    monkeypatch.setattr(memory, "_tuned", True)
    monkeypatch.setattr(memory, "_freezing", False)
    monkeypatch.setattr(memory, "_engine_frozen", False)
    yield
    gc.unfreeze()
    gc.collect()


def frozen_engine(nodes: int = 100) -> Engine:
    memory.release_frozen()
    with memory.collector_paused():
        engine = Engine(gpu_fleet(nodes, 8))
    memory.freeze_long_lived(engine)
    return engine


def one_round(engine: Engine, texts: list[int]) -> None:
    """Allocate one claim per selector text, give the devices back, settle (as allocate_round ends)."""
    for t in texts:
        sel = [f'device.attributes["gpu.example.com"].numa == {t % 4} && "commit-{t:08x}" != ""']
        out = engine.allocate(ClaimGroup(key=f"c{t}", claims=[claim(f"c{t}", [exact("gpu", "gpu", 1, sel)])]))
        assert out.allocated
        engine.release(out.devices)
    memory.settle()


def test_what_rounds_keep_is_frozen_not_left_in_the_collectors_generations(policy):
    engine = frozen_engine()
    one_round(engine, [0])
    frozen = gc.get_freeze_count()
    for r in range(1, 11):
        one_round(engine, list(range(r * 5, r * 5 + 5)))  # new texts: programs, plans, selector sets kept
        # A collection now would scan only what was made since the settle: the test's own few objects.
        assert len(gc.get_objects()) < 500
    # The rounds did keep objects (compiled programs and plans of 50 texts), now out of the collector's sight.
    assert gc.get_freeze_count() > frozen + 50 * 20


def test_rounds_of_known_selectors_leave_nothing_behind(policy):
    """Freezing after every round must not keep what the rounds dropped: with selectors already seen, the
    frozen set stays the same size round after round (a cycle frozen and then dropped would grow it)."""
    engine = frozen_engine()
    texts = [1, 2, 3, 4, 5]
    for _ in range(3):
        one_round(engine, texts)
    frozen, logged = gc.get_freeze_count(), engine.selector_stats()["logged"]
    for _ in range(20):
        one_round(engine, texts)
    # What may grow: the bounded log of availability changes that key indexes replay (an int per device
    # change, a node's name per node change). Each round makes hundreds of objects (outcomes, allocation
    # results, records): none may stay.
    logged = engine.selector_stats()["logged"] - logged
    assert 0 < logged < 1_000
    assert gc.get_freeze_count() - frozen <= logged + 50


def test_a_replaced_engine_is_freed_and_its_frozen_objects_with_it(policy):
    old = frozen_engine()
    one_round(old, [7, 8])
    gone = weakref.ref(old)
    size = gc.get_freeze_count()
    del old
    new = frozen_engine()  # release_frozen first: the old engine's cycles are collected
    assert gone() is None
    one_round(new, [7, 8])
    # One engine frozen, not two: the frozen set did not grow by another engine's worth.
    assert gc.get_freeze_count() < size * 1.2
