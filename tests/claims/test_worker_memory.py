"""The worker's allocation rounds keep the collector's generations empty (dra.engine.memory via the engine cache):
what a round leaves alive (compiled selectors, plans, the rows read) is frozen at its end, so no collection in
a long-running worker has the growing caches to rescan. Object counts, no timings."""
from __future__ import annotations

import gc

import pytest

from claims.models import ResourceClaim
from claims.services import claims as claim_services
from claims.services.engines import engines
from dra.engine import memory
from scheduler.services import allocation
from tests.claims import fleet as fleet_helpers

pytestmark = pytest.mark.django_db
NS = "team-a"


@pytest.fixture
def worker_policy(monkeypatch):
    monkeypatch.setattr(memory, "_tuned", True)  # this test process's thresholds stay as they are
    monkeypatch.setattr(memory, "_freezing", False)
    monkeypatch.setattr(memory, "_worker", True)  # as worker_start() sets it in a Celery worker
    monkeypatch.setattr(memory, "_engine_frozen", False)
    engines.reset()
    yield
    engines.reset()
    gc.unfreeze()
    gc.collect()


def selector_claim(name: str, text: int) -> dict:
    body = fleet_helpers.gpu_claim(name)
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.driver == "gpu.nvidia.com" && "commit-{text:08x}" != ""'}}]
    return body


def test_rounds_leave_nothing_in_the_collectors_generations(worker_policy):
    fleet_helpers.load_fleet({"c1": [("h100", 4)]})
    claim_services.create_claims(NS, [selector_claim("warm", 0)])
    allocation.allocate_round()  # builds and freezes the engine
    frozen = gc.get_freeze_count()
    for r in range(1, 6):
        made = claim_services.create_claims(NS, [selector_claim(f"c{r}-{i}", r * 10 + i) for i in range(3)])
        assert allocation.allocate_round().allocated == 3
        # Left for the collector: only what was made since the round's end (this loop's few objects), not
        # the programs, plans and rows the rounds keep.
        assert len(gc.get_objects()) < 500
        for c in made:
            claim_services.release_claim(c.id)
    assert ResourceClaim.objects.filter(allocation__isnull=False).count() == 1
    assert gc.get_freeze_count() > frozen + 15 * 20  # the rounds did keep objects: 15 selector texts' worth


def test_a_process_that_is_not_a_worker_does_not_freeze_after_rounds(worker_policy, monkeypatch):
    """The embedded runner decides in the web process: what its requests hold at a round's end must stay
    collectable (frozen, its cyclic garbage would be kept until the next engine replacement)."""
    monkeypatch.setattr(memory, "_worker", False)
    fleet_helpers.load_fleet({"c1": [("h100", 4)]})
    claim_services.create_claims(NS, [selector_claim("warm", 0)])
    allocation.allocate_round()  # builds and freezes the engine, as before
    frozen = gc.get_freeze_count()
    freezes = []
    real_freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(gc.get_freeze_count()) or real_freeze())
    claim_services.create_claims(NS, [selector_claim(f"c{i}", 10 + i) for i in range(3)])
    assert allocation.allocate_round().allocated == 3
    # No freeze at all. (The permanent generation may shrink: a frozen object that the round replaces, a
    # per-process cache entry say, is still freed by reference counting.)
    assert freezes == [] and gc.get_freeze_count() <= frozen
