"""What a claims round keeps between rounds to split its groups by cluster (scheduler.services.allocation): the
clusters a claim shape may take devices in come from static facts of the fleet, so the engine is asked once per
shape while the fleet view (and with it the engine) stands, and again after the fleet changed."""
from __future__ import annotations

import pytest

from claims.services import claims as claim_services
from dra.engine.engine import Engine
from inventory.services import sync
from scheduler.services import allocation
from tests.claims.fleet import cluster_body, gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db, pytest.mark.live]


def test_a_shapes_clusters_are_asked_once_per_fleet_view(monkeypatch):
    load_fleet({"ca": [("h100", 2)], "cb": [("l4", 2)]})
    asked: list[str] = []
    original = Engine.device_clusters
    monkeypatch.setattr(Engine, "device_clusters", lambda self, group: asked.append(group.key) or original(self, group))

    def round_of(names: list[str], count: int = 1) -> None:
        claim_services.create_claims("team-a", [gpu_claim(name, count) for name in names])
        assert allocation.allocate_round().allocated == len(names)

    round_of(["a1", "a2", "a3"])
    assert len(asked) == 1  # one shape: asked for its first claim, the others alike
    round_of(["b1", "b2"])
    assert len(asked) == 1  # the next round keeps the answer
    round_of(["c1"], count=2)
    assert len(asked) == 2  # another shape is asked for
    sync.push_inventory("cb", cluster_body("cb", [("l4", 3)]))  # the fleet changed: a new view, a new engine
    round_of(["d1"])
    assert len(asked) == 3
