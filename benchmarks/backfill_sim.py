"""Walltime backfill replay: idle GPUs on nodes held for queue heads, with and without time-aware backfill.

A virtual-clock replay (one round per lease-sweep period) of the scheduler's queue-head holds, on the pure
library only (no Django, so the pure test tier runs it): ``dra.engine`` places, ``dra.engine.timeline.plan_starts``
plans each queue's first ``plan_depth`` claims exactly as ``scheduler.services.plan`` does (walltime ends and
planned stays padded by the sweep's period and a round's latency), and ``dra.engine.timeline.may_backfill`` is
the rule ``scheduler.services.backfill`` applies. The round mirrors ``scheduler.services.queue_holds``: held
nodes and nodes with devices planned for other claims are tried last (a claim's own planned node not, once its
planned start has come); a placement that lands on a held node, or takes devices planned for another claim, is
undone unless the backfill rule lets it stay (a planned claim whose start has come may take its planned node's
share); the first claim of a queue that fits nowhere becomes its head and holds the node with the most free
GPUs; a head tried again gives its node up first. The heads holding nodes are planned first.

Claims: 1-GPU short jobs (2-20 min walltime) and 8-GPU jobs (15-60 min), some 1-GPU jobs without a walltime
(they run as long, but nothing knows it), some jobs ending early. ``backfill=False`` is the space-only hold
(nothing enters a held node); ``backfill=True`` lets a claim in when the rule allows. Measured: the idle
fraction of the GPUs of held nodes (GPU-rounds), the planned-start error of planned claims that waited, and the
heads delayed by a backfilled claim (waiting at or past their planned start while a backfilled claim runs on
their held node or on their planned devices).
"""
from __future__ import annotations

import heapq
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from dra.engine import AllocatedDevice, ClaimGroup, ClusterInventory, Engine, FleetSnapshot
from dra.engine.timeline import Ending, Planned, Waiting, may_backfill, plan_starts

DRIVER = "gpu.example.com"
CLUSTER = "c1"
GPUS = 8
SWEEP = 5.0  # the lease sweep's period: a round runs after each
LATENCY = 1.0  # a round's latency
MARGIN = SWEEP + LATENCY
PLAN_INTERVAL = 10.0


@dataclass(frozen=True)
class Shape:
    nodes: int = 500
    seconds: float = 7200.0
    load: float = 1.3
    queues: int = 4
    eight_share: float = 0.1  # of the claims, 8-GPU ones
    no_walltime: float = 0.05  # of the 1-GPU claims, those without a walltime
    early: float = 0.1  # of the claims with a walltime, those that end early (released by their user)
    plan_depth: int = 10
    seed: int = 1


SMALL = Shape(nodes=40, seconds=3600.0)  # past the warm-up: the fleet is full for its second half


@dataclass
class Job:
    id: int
    queue: str
    count: int
    walltime: float | None  # what the scheduler knows (None: no walltime)
    runs: float  # how long it in fact runs
    submitted: float
    started: float | None = None
    node: str = ""
    devices: list[AllocatedDevice] = field(default_factory=list)
    planned: tuple[float, float] | None = None  # (when planned, the planned start), the first plan that gave one
    protects: tuple[int, float] | None = None  # backfilled: (planned claim, its planned start)

    def group(self, avoid: frozenset = frozenset()) -> ClaimGroup:
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": f"c{self.id}", "namespace": self.queue, "uid": f"u{self.id}"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu",
                                                                              "count": self.count}}]}}}
        return ClaimGroup([claim], key=f"c{self.id}", avoid_nodes=avoid)


def fleet(nodes: int) -> Engine:
    names = [f"n{i:04d}" for i in range(nodes)]
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": n},
               "spec": {"driver": DRIVER, "nodeName": n, "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": f"gpu-{i}", "attributes": {}} for i in range(GPUS)]}} for n in names]
    gpu = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
           "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
    inventory = ClusterInventory(name=CLUSTER, nodes=[{"name": n, "labels": {"node": n}} for n in names],
                                 resource_slices=slices)
    return Engine(FleetSnapshot([inventory], [gpu]))


def arrivals(shape: Shape) -> list[Job]:
    """The claim stream: Poisson arrivals sized so that GPU demand is ``load`` x the fleet."""
    rng = random.Random(shape.seed)
    mean = (1 - shape.eight_share) * 11 * 60 + shape.eight_share * GPUS * 37.5 * 60  # GPU-seconds per claim
    rate = shape.load * shape.nodes * GPUS / mean
    jobs, now = [], 0.0
    while True:
        now += rng.expovariate(rate)
        if now >= shape.seconds:
            return jobs
        eight = rng.random() < shape.eight_share
        wall = rng.uniform(15, 60) * 60 if eight else rng.uniform(2, 20) * 60
        runs = wall * rng.uniform(0.5, 1.0) if rng.random() < shape.early else wall
        known = None if (not eight and rng.random() < shape.no_walltime) else wall
        jobs.append(Job(len(jobs) + 1, f"q{rng.randrange(shape.queues)}", GPUS if eight else 1, known, runs, now))


class Replay:
    def __init__(self, shape: Shape, backfill: bool) -> None:
        self.shape, self.backfill = shape, backfill
        self.engine = fleet(shape.nodes)
        self.incoming = arrivals(shape)
        self.pending: list[Job] = []  # in the scheduler's order (submission, then id)
        self.running: list[tuple[float, int, Job]] = []  # (release time, id, job)
        self.used: dict[str, int] = defaultdict(int)
        self.held: dict[str, tuple[str, int]] = {}  # node -> (queue, head claim id)
        self.plan: dict[int, Planned] = {}
        self.planned_ids: list[int] = []
        self.planned_at = -PLAN_INTERVAL
        self.idle = self.held_gpus = 0
        self.delayed: set[int] = set()
        self.backfilled = 0
        # (estimated at, estimated start, start, GPUs, submitted) of each planned claim that started
        self.estimates: list[tuple[float, float, float, int, float]] = []
        self.started = 0
        self.by_id = {j.id: j for j in self.incoming}
        self.names = [f"n{i:04d}" for i in range(shape.nodes)]

    # ----------------------------------------------------------------------------------------- the clock
    def run(self) -> dict:
        now, k = 0.0, 0
        while now < self.shape.seconds:
            while k < len(self.incoming) and self.incoming[k].submitted <= now:
                self.pending.append(self.incoming[k])
                k += 1
            self.release(now)
            self.check_delays(now)
            self.replan(now)
            self.round(now)
            for node in self.held:
                self.held_gpus += GPUS
                self.idle += GPUS - self.used[node]
            now += SWEEP
        return self.figures()

    def release(self, now: float) -> None:
        """The sweep: every claim whose walltime (or its user) ended by now gives its devices back."""
        while self.running and self.running[0][0] <= now:
            job = heapq.heappop(self.running)[2]
            self.engine.release(job.devices)
            self.used[job.node] -= job.count

    def check_delays(self, now: float) -> None:
        """A head waiting at or past its planned start while a backfilled claim holds a GPU it was promised (on
        its held node or among its planned devices)."""
        heads = {head: node for node, (_, head) in self.held.items()}
        for _, _, job in self.running:
            if job.protects is None:
                continue
            for head, node in heads.items():
                p = self.plan.get(head)
                if p is None or p.start > now:
                    continue
                if job.node == node or set(job.devices) & set(p.devices):
                    self.delayed.add(head)

    # ----------------------------------------------------------------------------------------- the plan
    def firsts(self) -> list[Job]:
        """Each queue's first ``plan_depth`` pending claims, in the scheduler's order across queues."""
        taken: dict[str, int] = defaultdict(int)
        out = []
        for job in self.pending:
            if taken[job.queue] < self.shape.plan_depth:
                taken[job.queue] += 1
                out.append(job)
        return out

    def replan(self, now: float) -> None:
        first = self.firsts()
        ids = [j.id for j in first]
        if ids == self.planned_ids and now - self.planned_at < PLAN_INTERVAL:
            return
        # What the plan knows of a running claim: its walltime end (an early end is its user's, unknown ahead).
        ends = [Ending(job.started + job.walltime + MARGIN, tuple(job.devices))
                for _, _, job in self.running if job.walltime is not None and job.started is not None]
        # The heads holding nodes are planned first (``scheduler.services.plan``): the round keeps their nodes
        # from the claims behind them unless those end before the heads' planned starts, as planned after them.
        heads = {head for _, head in self.held.values()}
        first = [j for j in first if j.id in heads] + [j for j in first if j.id not in heads]
        waiting = [Waiting(j.group(), None if j.walltime is None else j.walltime + MARGIN) for j in first]
        out = plan_starts(self.engine, ends, waiting, now)
        self.plan = {j.id: p for j, p in zip(first, out, strict=True) if p is not None}
        self.planned_ids, self.planned_at = ids, now
        for j in first:
            if j.planned is None and j.id in self.plan:
                j.planned = (now, self.plan[j.id].start)

    # ----------------------------------------------------------------------------------------- the round
    def round(self, now: float) -> None:
        heads: set[str] = set()  # queues whose head was found this round (or kept from before)
        heads.update(q for q, _ in self.held.values())
        failed: dict[int, float] = {}  # count -> the shortest walltime that found no room this round
        waiting = []
        for job in self.pending:
            wall = job.walltime if job.walltime is not None else float("inf")
            if job.count in failed and wall >= failed[job.count] and job.id not in self.head_ids():
                waiting.append(job)
                continue
            if not self.try_start(job, now, heads):
                failed[job.count] = min(wall, failed.get(job.count, float("inf")))
                waiting.append(job)
        self.pending = waiting

    def head_ids(self) -> set[int]:
        return {head for _, head in self.held.values()}

    def try_start(self, job: Job, now: float, heads: set[str]) -> bool:
        for node, (_, head) in list(self.held.items()):
            if head == job.id:  # a head decided again gives its node up first
                del self.held[node]
                heads.discard(job.queue)
        # As the round's screen does: held nodes and nodes with devices planned for other claims are tried last.
        # A claim whose planned start has come tries its planned node with them: its devices are there.
        own = self.plan.get(job.id)
        due = {own.node} if own is not None and own.node and own.start <= now else set()
        avoid = frozenset((CLUSTER, n) for n in (set(self.held) | self.planned_nodes(job.id)) - due)
        out = self.engine.allocate(job.group(avoid), raise_errors=False)
        if not out.allocated and avoid:
            out = self.engine.allocate(job.group(), raise_errors=False)  # would it fit only there?
        if not out.allocated:
            if job.queue not in heads:
                heads.add(job.queue)
                self.reserve(job)
            return False
        node = out.node or ""
        if not self.may_stay(job, out.devices, node, now):
            self.engine.release(out.devices)
            return False
        job.started, job.node, job.devices = now, node, list(out.devices)
        self.used[node] += job.count
        heapq.heappush(self.running, (now + job.runs, job.id, job))
        self.started += 1
        if job.planned is not None:
            self.estimates.append((job.planned[0], job.planned[1], now, job.count, job.submitted))
        return True

    def planned_nodes(self, mine: int) -> set[str]:
        return {p.node for cid, p in self.plan.items() if cid != mine and p.node}

    def may_stay(self, job: Job, devices, node: str, now: float) -> bool:
        """The round's screen (``scheduler.services.queue_holds`` with ``scheduler.services.backfill``): devices
        planned for another claim are taken only by a claim that ends before that claim's planned start; on a
        held node, only when the holding queue is in the plan too. Space-only holds (``backfill=False``) keep
        every held node for its head and protect no planned device elsewhere."""
        held = node in self.held
        if not self.backfill:
            return not held
        mine = set(devices)
        own = self.plan.get(job.id)
        if own is not None and own.start <= now and own.node == node and len(own.devices) >= len(mine):
            return True  # its turn, on its planned node: it takes as many of the node's devices as planned
        taken = [(cid, p) for cid, p in self.plan.items() if cid != job.id and mine & set(p.devices)]
        if not held and not taken:
            return True
        if held:
            queue = self.held[node][0]
            if not any(p.node and self.queue_of(cid) == queue for cid, p in self.plan.items()):
                return False  # the holding queue is not in the plan: nothing says when its head starts
        if not may_backfill([job.walltime], now, MARGIN, [p.start for _, p in taken]):
            return False
        if taken:
            cid, p = min(taken, key=lambda t: t[1].start)
            job.protects = (cid, p.start)
        else:
            head = self.held[node][1]
            job.protects = (head, self.plan[head].start if head in self.plan else now)
        if held:
            self.backfilled += 1
        return True

    def queue_of(self, claim_id: int) -> str:
        return self.by_id[claim_id].queue

    def reserve(self, job: Job) -> None:
        """The head holds the node with the most free GPUs (not held already); a 1-GPU head needs none."""
        if job.count < 2:
            return
        free = [(self.used[n], n) for n in self.names if n not in self.held]
        if free:
            self.held[min(free)[1]] = (job.queue, job.id)

    # ----------------------------------------------------------------------------------------- the figures
    def figures(self) -> dict:
        """The estimate error of a claim: |estimated start - actual start| / its actual wait (from submission to
        start), the estimate being the planned start it got when it first became a planned claim; over the planned
        claims that did not start in the round that first planned them (``started_at_once`` counts those: each
        on time). ``strict_*``: the same error over the wait from the estimate to the start (what the estimate
        predicted), never smaller."""
        waited = [(est, start, at, sub, count) for at, est, start, count, sub in self.estimates if start > at]
        errors = sorted(abs(est - start) / (start - sub) for est, start, at, sub, _ in waited)
        strict = sorted(abs(est - start) / (start - at) for est, start, at, sub, _ in waited)
        by_size = {}
        for n in sorted({w[4] for w in waited}):
            sub_errors = sorted(abs(est - start) / (start - s) for est, start, at, s, c in waited if c == n)
            by_size[n] = (len(sub_errors), statistics.median(sub_errors), _p90(sub_errors))
        return {"idle": self.idle / self.held_gpus if self.held_gpus else 0.0, "held_gpu_rounds": self.held_gpus,
                "delayed": len(self.delayed), "backfilled": self.backfilled, "started": self.started,
                "submitted": len(self.incoming), "estimated": len(errors),
                "started_at_once": sum(1 for at, _, start, _, _ in self.estimates if start <= at),
                "error_median": statistics.median(errors) if errors else None, "error_p90": _p90(errors),
                "strict_median": statistics.median(strict) if strict else None, "strict_p90": _p90(strict),
                "by_size": by_size}


def _p90(values: list[float]) -> float | None:
    return values[min(len(values) - 1, int(len(values) * 0.9))] if values else None


def compare(shape: Shape) -> dict:
    """The same claim stream, space-only holds then time-aware backfill."""
    return {"before": Replay(shape, backfill=False).run(), "after": Replay(shape, backfill=True).run()}
