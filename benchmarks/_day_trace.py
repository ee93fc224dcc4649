"""A recorded day of a busy GPU fleet, for benchmarks/replay_day_bench.py and the day-sized replay test.

``happened(shape)`` plays the day on a simple model of the service (pure Python, seeded): Poisson arrivals from
three queues' namespaces (team-a, team-b, team-c, an equal share of the offered load each), 1, 2, 4 or 8 GPUs per
claim, holds uniform in ``shape.hold``, first fit on nodes in arrival order with smaller claims backfilling
around the ones that do not fit, except that the oldest claim, once it has waited ``hold_after``, holds the
fleet for itself (the service's head-of-queue hold); some users give up on a claim that waited too long. The
history starts ``lead`` seconds before the window, so the window opens on a busy fleet, with claims still
waiting into it.

``write(day, start)`` stores it as the service keeps it, for ``scheduler.services.replay_trace`` to read: a
``ClaimHistory`` row per claim (arrival, shape, walltime), the usage ledger's ``UsageInterval`` per device held
(allocation and release times, node and device), and the claims' ``Created``/``Allocated``/``Released`` events
(a claim given up on: ``Released`` without a run). ``trace(day, start)`` builds the same ``replay_trace.Trace``
in memory (no database), with ``snapshot(shape)`` the fleet and ``epochs(shape)`` the queue specs, for pure
tests and profiling. Nothing happens at import.
"""
from __future__ import annotations

import heapq
import math
import random
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

GPU = "gpu.nvidia.com"
CLUSTER = "day"
QUEUES = ("a", "b", "c")


@dataclass(frozen=True)
class DayShape:
    nodes: int = 128  # of 8 H100 GPUs each (inventory.demo's "h100" node)
    per_node: int = 8
    seconds: float = 86400.0  # the window
    lead: float = 7200.0  # history before it
    load: float = 1.1  # offered GPU-seconds over the fleet's
    sizes: tuple[tuple[int, float], ...] = ((1, 0.5), (2, 0.25), (4, 0.15), (8, 0.1))  # (GPUs, probability)
    hold: tuple[float, float] = (300.0, 3600.0)  # seconds a claim runs once started
    hold_after: float = 1800.0  # the oldest claim waiting this long blocks the others until it fits
    patience: tuple[float, float] = (0.3, 3 * 3600.0)  # (share of users who give up, after waiting how long)
    weights: tuple[float, float, float] = (1, 2, 1)
    nominal: tuple[int, int, int] = (256, 512, 256)  # GPUs, unlimited borrowing
    half_life: int = 86400
    weight_change: tuple[float, str, float] | None = (12 * 3600.0, "b", 1)  # (at, queue, new weight) in the window
    seed: int = 39

    @property
    def gpus(self) -> int:
        return self.nodes * self.per_node


@dataclass
class Recorded:
    uid: str
    queue: str
    name: str
    gpus: int
    arrival: float  # seconds from the window's start (negative: before it)
    hold: float
    walltime: int
    gives_up: float | None  # when its user gives up if it has not started by then
    run: tuple[float, float, int, list[int]] | None = None  # (start, end, node, GPU indexes)
    gave_up: float | None = None


@dataclass
class Day:
    shape: DayShape
    claims: list[Recorded] = field(default_factory=list)

    @property
    def intervals(self) -> int:
        return sum(c.gpus for c in self.claims if c.run is not None)


def node_name(i: int) -> str:
    return f"h100-{i:03d}"


def _arrivals(shape: DayShape, rng: random.Random) -> list[Recorded]:
    sizes, probabilities = zip(*shape.sizes, strict=True)
    mean = sum(s * p for s, p in shape.sizes) * sum(shape.hold) / 2
    rate = shape.load * shape.gpus / mean  # claims per second, all queues
    out, t, i = [], -shape.lead, 0
    while True:
        t += rng.expovariate(rate)
        if t >= shape.seconds:
            return out
        i += 1
        queue = QUEUES[i % len(QUEUES)]
        hold = rng.uniform(*shape.hold)
        gives_up = t + shape.patience[1] if rng.random() < shape.patience[0] else None
        walltime = int(math.ceil(hold * 1.5 / 600) * 600)
        out.append(Recorded(str(uuid.UUID(int=rng.getrandbits(128), version=4)), queue, f"{queue}-{i}",
                            rng.choices(sizes, probabilities)[0], t, hold, walltime, gives_up))


def happened(shape: DayShape = DayShape()) -> Day:
    """The day as the model service ran it (see the module docstring)."""
    rng = random.Random(shape.seed)
    claims = _arrivals(shape, rng)
    free = [list(range(shape.per_node)) for _ in range(shape.nodes)]
    waiting: dict[int, deque[Recorded]] = {s: deque() for s, _ in shape.sizes}
    running: list[tuple[float, int, Recorded]] = []
    k, now = 0, -shape.lead
    while k < len(claims) or running:
        now = min(claims[k].arrival if k < len(claims) else math.inf, running[0][0] if running else math.inf)
        if now >= shape.seconds + shape.lead:
            break
        while running and running[0][0] <= now:
            _, _, c = heapq.heappop(running)
            assert c.run is not None
            free[c.run[2]].extend(c.run[3])
        while k < len(claims) and claims[k].arrival <= now:
            waiting[claims[k].gpus].append(claims[k])
            k += 1
        _place(shape, now, free, waiting, running)
    for c in claims:  # waiting still when the history ends: gone if its user gave up by then
        if c.run is None and c.gives_up is not None and c.gives_up < shape.seconds:
            c.gave_up = c.gives_up
    return Day(shape, claims)


def _place(shape: DayShape, now: float, free: list[list[int]], waiting: dict[int, deque[Recorded]],
           running: list) -> None:
    """Start what fits, oldest first; a claim that gave up leaves; the oldest blocks once it waited long."""
    while True:
        for q in waiting.values():
            while q and q[0].gives_up is not None and q[0].gives_up <= now:
                gone = q.popleft()
                gone.gave_up = gone.gives_up
        heads = sorted((q[0] for q in waiting.values() if q), key=lambda c: c.arrival)
        if not heads:
            return
        widest = max(len(f) for f in free)
        for i, c in enumerate(heads):
            if c.gpus <= widest:
                node = next(n for n, f in enumerate(free) if len(f) >= c.gpus)
                gpus, free[node][:] = free[node][:c.gpus], free[node][c.gpus:]
                c.run = (now, now + c.hold, node, gpus)
                heapq.heappush(running, (now + c.hold, id(c), c))
                waiting[c.gpus].popleft()
                break
            if i == 0 and now - c.arrival >= shape.hold_after:
                return  # the oldest holds the fleet
        else:
            return


# ------------------------------------------------------------------------------------------------ the queues

def queue_specs(shape: DayShape, weight_of_b: float | None = None) -> dict[str, dict]:
    """The three queues' normalized specs (``weight_of_b``: b's weight after the day's change)."""
    from benchmarks._queue_world import queue_body
    from queues import spec as queue_spec

    out = {}
    for name, weight, nominal in zip(QUEUES, shape.weights, shape.nominal, strict=True):
        if weight_of_b is not None and shape.weight_change and name == shape.weight_change[1]:
            weight = weight_of_b
        body = queue_body(name, namespaces=[f"team-{name}"], gpus=nominal, weight=weight,
                          fairSharing={"halfLifeSeconds": shape.half_life})
        obj, errors = queue_spec.normalize(body)
        assert not errors, errors
        out[name] = obj["spec"]
    return out


def queue_bodies(shape: DayShape) -> list[dict]:
    from benchmarks._queue_world import queue_body

    return [queue_body(name, namespaces=[f"team-{name}"], gpus=nominal, weight=weight,
                       fairSharing={"halfLifeSeconds": shape.half_life})
            for name, weight, nominal in zip(QUEUES, shape.weights, shape.nominal, strict=True)]


def epochs(shape: DayShape) -> list[tuple[float, dict[str, dict[str, dict]]]]:
    first = [(0.0, {"Queue": queue_specs(shape), "Reservation": {}})]
    if shape.weight_change is None:
        return first
    return first + [(shape.weight_change[0], {"Queue": queue_specs(shape, shape.weight_change[2]),
                                              "Reservation": {}})]


# ------------------------------------------------------------------------------------------------ as stored

def _when(start: datetime, seconds: float) -> datetime:
    return start + timedelta(microseconds=round(seconds * 1e6))


def write(day: Day, start: datetime, chunk: int = 5000) -> dict[str, int]:
    """Store the day as the service keeps it (the window from ``start``); Django set up. Rows written, by kind."""
    from django.db import connection

    from claims.models import ClaimEvent, ClaimHistory
    from claims.services import events as ev
    from tests.claims.fleet import gpu_claim
    from usage.models import UsageInterval

    history, ledger, events = [], [], []
    for c in day.claims:
        arrived = _when(start, c.arrival)
        history.append(ClaimHistory(claim_uid=c.uid, namespace=f"team-{c.queue}", claim_name=c.name, labels={},
                                    spec=gpu_claim(c.name, c.gpus)["spec"], lease_seconds=c.walltime,
                                    created_at=arrived))
        events.append((c, ev.CREATED, arrived))
        if c.run is not None:
            began, ended, node, gpus = c.run
            ledger += [UsageInterval(claim_id=0, claim_uid=c.uid, claim_name=c.name, namespace=f"team-{c.queue}",
                                     queue=c.queue, cluster=CLUSTER, node=node_name(node), driver=GPU,
                                     pool=node_name(node), device=f"gpu-{g}", sharing="exclusive", weight=1,
                                     started_at=_when(start, began), ended_at=_when(start, ended)) for g in gpus]
            events += [(c, ev.ALLOCATED, _when(start, began)), (c, ev.RELEASED, _when(start, ended))]
        elif c.gave_up is not None:
            events.append((c, ev.RELEASED, _when(start, c.gave_up)))
    ClaimHistory.objects.bulk_create(history, batch_size=chunk)
    UsageInterval.objects.bulk_create(ledger, batch_size=chunk)
    # Raw: ClaimEvent.created_at is auto_now_add, and these events happened in the past.
    table = connection.ops.quote_name(ClaimEvent._meta.db_table)
    rows = [(f"team-{c.queue}", c.name, c.uid, kind, "", "", at) for c, kind, at in sorted(events,
                                                                                         key=lambda e: e[2])]
    with connection.cursor() as cursor:
        for i in range(0, len(rows), chunk):
            cursor.executemany(f"INSERT INTO {table} (claim_id, namespace, claim_name, claim_uid, type, reason, "
                               "message, created_at) VALUES (NULL, %s, %s, %s, %s, %s, %s, %s)", rows[i:i + chunk])
    return {"history": len(history), "intervals": len(ledger), "events": len(rows)}


def snapshot(shape: DayShape):
    """The fleet as a ``dra.engine.FleetSnapshot`` (no database)."""
    from dra.engine import ClusterInventory, FleetSnapshot
    from inventory import demo

    slices, nodes = [], []
    for i in range(shape.nodes):
        slices += demo.node_slices("h100", node_name(i))
        nodes.append({"name": node_name(i), "labels": {"kubernetes.io/hostname": node_name(i)}})
    return FleetSnapshot(clusters=[ClusterInventory(name=CLUSTER, nodes=nodes, resource_slices=slices)],
                         device_classes=demo.standard_device_classes())


def trace(day: Day, start: datetime):
    """What ``replay_trace.load`` reads of ``write``'s rows, built in memory: the window's claims (and those that
    arrived before it and first ran inside it), devices held when it opened, and the queue epochs."""
    from dra.engine import AllocatedDevice
    from scheduler.services.replay_trace import Held, Run, Trace, TraceClaim
    from tests.claims.fleet import gpu_claim

    claims, background = [], []
    for c in day.claims:
        ran = c.run is not None and 0 <= c.run[0] < day.shape.seconds
        if c.run is not None and c.run[0] < 0 <= c.run[1]:
            end = None if c.run[1] >= day.shape.seconds else c.run[1]
            background.append(Held([AllocatedDevice(CLUSTER, GPU, node_name(c.run[2]), f"gpu-{g}", None)
                                    for g in c.run[3]], c.queue, "", end, float(c.gpus)))
        if not (c.arrival >= 0 or ran):
            continue
        t = TraceClaim(c.uid, f"team-{c.queue}", c.name, {}, gpu_claim(c.name, c.gpus)["spec"], c.walltime,
                       c.arrival, _when(start, c.arrival))
        if ran:
            assert c.run is not None
            end = None if c.run[1] >= day.shape.seconds else c.run[1]
            t.runs.append(Run(c.run[0], end, float(c.gpus), c.queue, ""))
            t.ended = c.run[1]
        elif c.gave_up is not None:
            t.ended = c.gave_up
        claims.append(t)
    claims.sort(key=lambda t: (t.created_at, t.uid))
    return Trace(start, start + timedelta(seconds=day.shape.seconds), claims, background, epochs(day.shape))


def decayed0(day: Day) -> dict[str, float]:
    """Each queue's decayed usage when the window opens, as ``usage_sql.decayed_as_of`` reads it from the
    ledger (the runs closed before the start)."""
    h = float(day.shape.half_life)
    out = dict.fromkeys(QUEUES, 0.0)
    for c in day.claims:
        if c.run is not None and c.run[1] <= 0:
            out[c.queue] += c.gpus * (c.run[1] - c.run[0]) * 2.0 ** (c.run[1] / h)
    return out
