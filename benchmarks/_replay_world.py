"""A run of three queues recorded through the service's API, for the replay tests and benchmarks/replay_bench.py.

Queues a, b and c (namespaces team-a, team-b, team-c) share a fleet with nominal quotas and unlimited borrowing,
weights 1:2:1 by default; each submits claims of 1-4 GPUs as a Poisson stream sized to ``load`` x the fleet
and releases each one ``hold`` seconds after it was allocated (a user whose job ended), through the API. The
scheduler's round (``allocate_round``) runs after each arrival and release, as the service's event-driven
round does. Returns the window (start, end) the run covers. Needs Django set up on the service's database.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from django.utils import timezone

from benchmarks._queue_world import GPU, gpu_claim, queue_body

QUEUES = ("a", "b", "c")


@dataclass(frozen=True)
class Shape:
    seconds: float = 30.0
    gpus: int = 16  # of the fleet
    load: float = 1.6  # offered GPU-seconds over the fleet's
    hold: tuple[float, float] = (2.0, 6.0)  # seconds a claim holds its devices once allocated
    sizes: tuple[int, int] = (1, 4)
    weights: tuple[float, float, float] = (1, 2, 1)
    nominal: int = 2  # per queue, of GPUs
    tick: float = 0.05
    seed: int = 7


def make_queues(client, shape: Shape) -> None:
    for name, weight in zip(QUEUES, shape.weights, strict=True):
        body = queue_body(name, namespaces=[f"team-{name}"], gpus=shape.nominal, weight=weight)
        resp = client.post("/api/v1/queues", body, format="json")
        assert resp.status_code == 201, resp.content


def record(client, shape: Shape, allocate_round) -> tuple:
    """Run the stream against the API; (window start, window end)."""
    from claims.models import Phase, ResourceClaim

    rng = random.Random(shape.seed)
    mean = (shape.sizes[0] + shape.sizes[1]) / 2 * (shape.hold[0] + shape.hold[1]) / 2
    rate = shape.load * shape.gpus / mean / len(QUEUES)  # claims per second per queue
    start = timezone.now()
    began = time.monotonic()
    holds: dict[tuple[str, str], float] = {}
    n = 0
    while (elapsed := time.monotonic() - began) < shape.seconds:
        changed = False
        for q in QUEUES:
            for _ in range(poisson(rng, rate * shape.tick)):
                n += 1
                name = f"{q}{n}"
                resp = client.post(f"/api/v1/namespaces/team-{q}/resourceclaims",
                                   gpu_claim(name, rng.randint(*shape.sizes)), format="json")
                assert resp.status_code == 201, resp.content
                holds[(f"team-{q}", name)] = rng.uniform(*shape.hold)
                changed = True
        now = timezone.now()
        for ns, name, allocated_at in ResourceClaim.objects.filter(
                phase=Phase.ALLOCATED, namespace__name__in=[f"team-{q}" for q in QUEUES]).values_list(
                "namespace__name", "name", "allocated_at"):
            if (now - allocated_at).total_seconds() >= holds.get((ns, name), 0):
                resp = client.post(f"/api/v1/namespaces/{ns}/resourceclaims/{name}/release", {}, format="json")
                assert resp.status_code == 200, resp.content
                changed = True
        if changed:
            allocate_round()
        time.sleep(max(0.0, shape.tick - (time.monotonic() - began - elapsed)))
    return start, timezone.now()


def poisson(rng: random.Random, mean: float) -> int:
    count, threshold, product = 0, pow(2.718281828459045, -mean), rng.random()
    while product > threshold:
        count += 1
        product *= rng.random()
    return count


def shares(results: dict, side: str) -> dict[str, float]:
    return {q["name"]: q[side]["shareOfDeviceHours"] or 0.0 for q in results["queues"] if q["name"] in QUEUES}


__all__ = ["GPU", "QUEUES", "Shape", "make_queues", "poisson", "record", "shares"]
