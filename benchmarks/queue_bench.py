"""Queue benchmark: fair share, preemptions, start-time estimates and reclaim decision time.

An engine-level replay with a virtual clock (one tick = one simulated minute), using the service's own pieces:
the ``dra.engine`` for placement, ``queues.services.admission`` for the quota check (the same class the
commit service runs, on in-memory usage), ``queues.services.order`` for the dominant-resource fair-share
order, ``queues.services.estimate.expected_start`` for estimates, and
``scheduler.services.preemption.confirm_with_engine`` for victim choice. Nothing touches a database.

Shape (issue 15): 500 nodes x 8 H100 = 4,000 GPUs; queues A, B, C under the root, nominal 1,000 each (1,000
unassigned), weights 1:2:1, unlimited borrowing; each submits claims of 1-8 GPUs with leases of 1-30 simulated
minutes, more than the fleet holds, for 2 simulated hours. C starts after the first half hour (A and B borrow
its nominal meanwhile), so it has to reclaim it: the preemptions; shares are measured once it is back.

Goals: every queue's share of the GPU-hours used beyond nominal within 5 percentage points of its weighted
fair share; median start-time estimate error within 20 %; reclaim decision (victims chosen and marked, grace 0)
for a within-nominal 1-GPU claim with 4,000 claims running p99 < 1 s (KAI: 13.9 s); a 250 x 8-GPU gang of a
fourth queue D (nominal 2,000) reclaiming from the others < 10 s (KAI: 102 s).

    python benchmarks/queue_bench.py [--nodes 500] [--minutes 120] [--check]
    python benchmarks/queue_bench.py --backfill [--small] [--check]

``--backfill`` (issue 37) replays walltime claims on held nodes instead (``benchmarks/backfill_sim``: the
same planning engine and backfill rule as the scheduler): GPU-idle fraction on held nodes with space-only
holds and with time-aware backfill (goal: halved or better), planned-start error (median <= 10 %, p90 <= 25 %),
heads delayed by a backfilled claim (goal 0).

    python benchmarks/queue_bench.py --reservation [--small] [--rate 1.0] [--check]

``--reservation`` (issue 38) replays a daily reservation of 256 GPUs (02:00-06:00 Europe/Berlin, lead time
1 h, ``lendIdle``) on 128 nodes x 8 GPUs kept busy by a claim stream, for 5 simulated days
(``benchmarks/reservation_sim``: the scheduler's hold and lending rules, ``dra.windows``, and its node choice,
``queues.services.reservation_fit``): every window's claims all started <= 5 s late with the fleet >= 90 % busy
in the hour before its hold; the reserved-but-idle GPU-hours lent out are printed.
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")

import django  # noqa: E402

django.setup()

from dra.engine import ClaimGroup, ClusterInventory, Engine, FleetSnapshot  # noqa: E402
from dra.gang import Gang as LibGang  # noqa: E402
from dra.gang import GangMember as LibMember  # noqa: E402
from dra.gang import GangPlacer, Topology  # noqa: E402
from inventory import demo  # noqa: E402
from queues import spec as queue_spec  # noqa: E402
from queues.models import Queue  # noqa: E402
from queues.services.admission import _State  # noqa: E402
from queues.services.estimate import expected_start, fair_fraction  # noqa: E402
from queues.services.order import Shares, _rank  # noqa: E402
from queues.services.resolve import Tree  # noqa: E402
from scheduler.services import policy  # noqa: E402
from scheduler.services.gang_preemption import confirm_gang  # noqa: E402
from scheduler.services.preemption import confirm_with_engine  # noqa: E402

CLS = "gpu.nvidia.com"
CLUSTER = "c1"


@dataclass
class SimClaim:
    id: int
    queue: str
    count: int
    lease: int  # minutes
    submitted: int
    estimate: int | None = None
    started: int | None = None
    first_start: int | None = None
    devices: list = field(default_factory=list)
    cluster: str = ""
    node: str = ""

    @property
    def spec(self) -> dict:
        return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLS, "count": self.count}}]}}

    def group(self) -> ClaimGroup:
        return ClaimGroup(claims=[{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "metadata": {"name": f"c{self.id}", "namespace": self.queue.lower(),
                                                "uid": f"u{self.id}"}, "spec": self.spec}], key=f"c{self.id}")


class View:
    """What admission reads of a fleet view."""

    def __init__(self, snapshot):
        self.snapshot, self.key, self.cluster_labels = snapshot, ("bench",), [(CLUSTER, {})]


def fleet(nodes: int):
    slices, node_list = [], []
    for i in range(nodes):
        name = f"n{i:04d}"
        slices += demo.node_slices("h100", name)
        node_list.append({"name": name, "labels": {"kubernetes.io/hostname": name}})
    return FleetSnapshot(clusters=[ClusterInventory(name=CLUSTER, nodes=node_list, resource_slices=slices)],
                         device_classes=demo.standard_device_classes())


def tree_of(nominals: dict[str, int], weights: dict[str, int], parents: dict[str, str] | None = None) -> Tree:
    """Queues by name (``parents``: child -> parent, parents listed before their children in ``nominals``)."""
    queues: dict[str, Queue] = {}
    for i, (name, nominal) in enumerate(nominals.items(), start=1):
        obj, errors = queue_spec.normalize({"metadata": {"name": name.lower()}, "spec": {
            "weight": weights.get(name, 1), "quotas": [{"deviceClassName": CLS, "devices": {"nominal": nominal}}]}})
        assert not errors, errors
        parent = (parents or {}).get(name)
        queues[name] = Queue(id=i, name=name, spec=obj["spec"], weight=weights.get(name, 1),
                             parent_id=queues[parent].id if parent else None)
    return Tree(queues=queues, by_namespace={}, _redirects={})


class Unit:
    def __init__(self, claim: SimClaim, allocation: dict):
        self.placements = [type("P", (), {"claims": [claim], "allocations": [allocation], "cluster": CLUSTER})]


class Sim:
    def __init__(self, nodes: int, nominals: dict[str, int], weights: dict[str, int], seed: int = 1,
                 parents: dict[str, str] | None = None):
        self.snapshot = fleet(nodes)
        self.engine = Engine(self.snapshot)
        self.tree = tree_of(nominals, weights, parents)
        self.state = _State(self.tree, View(self.snapshot), None)
        self.state._usage = defaultdict(Fraction)  # the simulation's own ledger, not the database's charges
        self.state._withheld = []  # no reservation in these cases (the state would read them from the database)
        self.rng = random.Random(seed)
        self.pending: dict[str, list[SimClaim]] = defaultdict(list)
        self.running: list[tuple[int, int, SimClaim]] = []  # (end minute, id, claim)
        self.next_id = 0
        self.preemptions = 0
        self.finished: list[SimClaim] = []

    def used(self, name: str) -> int:
        qid = self.tree.queues[name].id
        return int(sum(a for k, a in self.state.usage.items() if k[0] == qid))

    def submit(self, name: str, now: int, count: int, lease: int) -> SimClaim:
        self.next_id += 1
        claim = SimClaim(self.next_id, name, count, lease, now)
        ahead = sum(c.count for c in self.pending[name])
        ends = sorted((end, c.count) for end, _, c in self.running)
        waiting = {q for q, items in self.pending.items() if items} | {name}
        share = fair_fraction(self.tree.queues[name], [self.tree.queues[q] for q in waiting], CLS,
                              sum(n for _, n in ends))
        cumulative = list(itertools.accumulate(n for _, n in ends))
        claim.estimate = expected_start([end for end, _ in ends], cumulative, claim.count + ahead, now, share)
        self.pending[name].append(claim)
        return claim

    def start(self, claim: SimClaim, now: int) -> bool:
        outcome = self.engine.allocate(claim.group(), raise_errors=False)
        if not outcome.allocated:
            return False
        verdict, _ = self.state.try_admit(Unit(claim, outcome.claims[0].allocation), claim.queue)
        if verdict.reason != "Admitted":
            self.engine.release(outcome.devices)
            return False
        claim.devices, claim.started = outcome.devices, now
        claim.cluster, claim.node = outcome.cluster or "", outcome.node or ""
        claim.first_start = now if claim.first_start is None else claim.first_start
        heapq.heappush(self.running, (now + claim.lease, claim.id, claim))
        return True

    def stop(self, claim: SimClaim) -> None:
        self.engine.release(claim.devices)
        key = (self.tree.queues[claim.queue].id, CLS, "devices", "", CLUSTER)
        self.state.usage[key] -= claim.count

    def tick(self, now: int) -> None:
        while self.running and self.running[0][0] <= now:
            done = heapq.heappop(self.running)[2]
            self.stop(done)
            self.finished.append(done)
        shares = Shares(self.tree, self.state.usage)
        heap = [_rank(self.tree, shares, q, [(CLS, items[0].count)]) + (q,)
                for q, items in self.pending.items() if items]
        heapq.heapify(heap)
        pos = dict.fromkeys(self.pending, 0)
        failed: dict[int, int] = {}  # count -> successes when it failed (the round's memo)
        successes = 0
        while heap:
            name = heapq.heappop(heap)[-1]
            claim = self.pending[name][pos[name]]
            pos[name] += 1
            if failed.get(claim.count) != successes:
                if self.start(claim, now):
                    successes += 1
                    shares.add(self.tree.queues[name].id, CLS, claim.count)
                else:
                    failed[claim.count] = successes
            if pos[name] < len(self.pending[name]):
                wants = [(CLS, self.pending[name][pos[name]].count)]
                heapq.heappush(heap, _rank(self.tree, shares, name, wants) + (name,))
        for name in self.pending:
            self.pending[name] = [c for c in self.pending[name] if c.started is None]

    def reclaim(self, claim: SimClaim, now: int, strategies: list[str] | None = None) -> list[SimClaim]:
        """Victims for ``claim`` (within its nominal, or with fair-share ``strategies``): borrowers' claims, most
        recently started first."""
        nominal = {q.id: Fraction(queue_spec.amount_of(q.spec["quotas"][0]["devices"]["nominal"]))
                   for q in self.tree.queues.values()}
        used = {q.id: Fraction(self.used(q.name)) for q in self.tree.queues.values()}
        own = self.tree.queues[claim.queue].id
        pool = sorted((c for _, _, c in self.running if self.tree.queues[c.queue].id != own
                       and used[self.tree.queues[c.queue].id] > nominal[self.tree.queues[c.queue].id]),
                      key=lambda c: (-c.started, c.id))
        held = {c.id: (self.tree.queues[c.queue].id, Fraction(c.count)) for c in pool}
        devices = {c.id: c.devices for c in pool}
        checks: tuple = (None,)
        if strategies:  # the product's own checks (``scheduler.services.policy``), on the simulated use
            checks = tuple(policy.strategy_checks(policy.FairShares(self.tree, nominal), own,
                                                  Fraction(claim.count), strategies))
        return confirm_with_engine(self.engine, claim.group(), pool, claim.count, held, used, nominal, own, devices,
                                   checks=checks)

    def preempt(self, victims: list[SimClaim], now: int) -> None:
        """Grace 0: the victims are released and wait again at their original place."""
        ids = {v.id for v in victims}
        self.running = [r for r in self.running if r[1] not in ids]
        heapq.heapify(self.running)
        for v in victims:
            self.stop(v)
            v.started, v.devices = None, []
            self.pending[v.queue].insert(0, v)
            self.pending[v.queue].sort(key=lambda c: (c.submitted, c.id))
        self.preemptions += len(victims)


# ------------------------------------------------------------------------------------------------- phases

def fair_share(nodes: int, minutes: int, rate: float) -> dict:
    """The 2-hour replay. ``rate``: the offered load as a multiple of the fleet (claims arrive as a Poisson-ish
    stream per queue, sized so that total demand is ``rate`` x capacity)."""
    nominals, weights = {"A": nodes * 2, "B": nodes * 2, "C": nodes * 2}, {"A": 1, "B": 2, "C": 1}
    sim = Sim(nodes, nominals, weights)
    per_claim = 4.5 * 15.5  # mean GPUs x mean minutes
    per_queue = rate * nodes * 8 / per_claim / 3
    beyond = dict.fromkeys(nominals, 0)
    decide = []
    late = minutes // 4  # C is idle at first (A and B borrow its nominal), then comes back and reclaims it
    for now in range(minutes):
        for name in nominals:
            if name == "C" and now < late:
                continue
            if name == "C" and now == late:  # it comes back with a burst worth its whole nominal
                while sum(c.count for c in sim.pending["C"]) < nominals["C"]:
                    sim.submit("C", now, sim.rng.randint(1, 8), sim.rng.randint(1, 30))
            for _ in range(int(per_queue) + (1 if sim.rng.random() < per_queue % 1 else 0)):
                sim.submit(name, now, sim.rng.randint(1, 8), sim.rng.randint(1, 30))
        sim.tick(now)
        for name, nominal in nominals.items():
            # A queue under its nominal whose head does not fit reclaims from the borrowers (grace 0).
            head = sim.pending[name][0] if sim.pending[name] else None
            if head is not None and sim.used(name) + head.count <= nominal:
                started = time.perf_counter()
                victims = sim.reclaim(head, now)
                if victims:
                    sim.preempt(victims, now)
                    sim.start(head, now)
                    sim.pending[name] = [c for c in sim.pending[name] if c.started is None]
                decide.append(time.perf_counter() - started)
        if now >= late + 10:  # once C is back and settled: GPU-minutes beyond nominal
            for name, nominal in nominals.items():
                beyond[name] += max(0, sim.used(name) - nominal)
    total = sum(beyond.values()) or 1
    wsum = sum(weights.values())
    started = [c for items in [[r[2] for r in sim.running]] for c in items] + []
    errors = []
    for c in _all_claims(sim):
        if c.first_start is not None and c.estimate is not None and c.first_start > c.submitted:
            errors.append(abs(c.estimate - c.first_start) / (c.first_start - c.submitted))
    return {"share": {n: beyond[n] / total for n in nominals}, "fair": {n: weights[n] / wsum for n in nominals},
            "preemptions": sim.preemptions, "estimate_error": statistics.median(errors) if errors else None,
            "estimated": len(errors), "running": len(started)}


def _all_claims(sim: Sim):
    seen = {}
    for _, _, c in sim.running:
        seen[c.id] = c
    for items in sim.pending.values():
        for c in items:
            seen[c.id] = c
    for c in sim.finished:
        seen[c.id] = c
    return list(seen.values())


def reclaim_time(nodes: int, trials: int = 50) -> list[float]:
    """4,000 one-GPU claims running (A and B borrow all of C's nominal); a 1-GPU claim of C arrives: time to
    choose its victim with the engine and mark it (grace 0: released and requeued)."""
    sim = Sim(nodes, {"A": nodes * 2, "B": nodes * 2, "C": nodes * 2}, {"A": 1, "B": 1, "C": 1})
    for i in range(nodes * 8):
        claim = sim.submit("A" if i % 2 else "B", 0, 1, 30)
        assert sim.start(claim, 0)
    sim.pending.clear()
    times = []
    for t in range(trials):
        claim = sim.submit("C", t, 1, 30)
        started = time.perf_counter()
        victims = sim.reclaim(claim, t)
        sim.preempt(victims, t)
        times.append(time.perf_counter() - started)
        assert victims and sim.start(claim, t), "no victim found"
        sim.pending["C"].clear()
        sim.pending["A"].clear()
        sim.pending["B"].clear()
    return times


def tree_reclaim_time(nodes: int, trials: int = 50) -> tuple[list[float], set[str]]:
    """A two-level tree: org-a {A1, A2} and org-b {B1}, every nominal 0 (all use is borrowed), fair-share
    preemption. A1 and A2 run ``nodes * 8`` one-GPU claims; 1-GPU claims of B1 arrive one at a time: time to
    choose each one's victim, shares compared where the queues meet (org-a against org-b), and mark it (grace
    0). Returns the times and the queues the victims came from."""
    nominals = {"org-a": 0, "A1": 0, "A2": 0, "org-b": 0, "B1": 0}
    parents = {"A1": "org-a", "A2": "org-a", "B1": "org-b"}
    sim = Sim(nodes, nominals, {}, parents=parents)
    for i in range(nodes * 8):
        claim = sim.submit("A1" if i % 2 else "A2", 0, 1, 30)
        assert sim.start(claim, 0)
    sim.pending.clear()
    times, sources = [], set()
    strategies = ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
    for t in range(trials):
        claim = sim.submit("B1", t, 1, 30)
        started = time.perf_counter()
        victims = sim.reclaim(claim, t, strategies)
        sim.preempt(victims, t)
        times.append(time.perf_counter() - started)
        assert victims and sim.start(claim, t), "no victim found"
        sources |= {v.queue for v in victims}
        sim.pending.clear()
    return times, sources


def gang_reclaim(nodes: int) -> tuple[float, int, bool]:
    """A, B, C (nominal 600 each at 500 nodes, so that the sum stays under 4,000) fill the fleet with 1-8 GPU
    claims, borrowing; D (nominal 2,000)
    submits a gang of 250 members of 8 GPUs: victims chosen node by node and confirmed by the gang placer
    (``scheduler.services.gang_preemption.confirm_gang``), then marked (grace 0: released)."""
    third = nodes * 8 * 15 // 100
    sim = Sim(nodes, {"A": third, "B": third, "C": third, "D": nodes * 4}, {"A": 1, "B": 2, "C": 1, "D": 1}, seed=5)
    for now in range(40):  # fill: more than the fleet holds
        for name in "ABC":
            for _ in range(nodes // 5):
                sim.submit(name, now, sim.rng.randint(1, 8), 600)
        sim.tick(now)
    sim.pending.clear()
    members = [LibMember(f"m{i}", [SimClaim(10**6 + i, "D", 8, 30, 0).group().claims[0]], key=f"m{i}")
               for i in range(nodes // 2)]
    lib = LibGang("big", members, len(members), Topology(), key="gang:big")
    placer = GangPlacer(sim.engine, sim.snapshot)
    started = time.perf_counter()
    nominal = {q.id: Fraction(queue_spec.amount_of(q.spec["quotas"][0]["devices"]["nominal"]))
               for q in sim.tree.queues.values()}
    used = {q.id: Fraction(sim.used(q.name)) for q in sim.tree.queues.values()}
    own = sim.tree.queues["D"].id
    pool = sorted((c for _, _, c in sim.running if used[sim.tree.queues[c.queue].id] >
                   nominal[sim.tree.queues[c.queue].id]), key=lambda c: (-c.started, c.id))
    held = {c.id: (sim.tree.queues[c.queue].id, Fraction(c.count)) for c in pool}
    victims = confirm_gang(placer, lib, pool, nodes * 4, held, used, nominal, own, {c.id: c.devices for c in pool})
    sim.preempt(victims, 40)
    seconds = time.perf_counter() - started
    return seconds, len(victims), bool(victims) and placer.place(lib, commit=False).placed


def backfill_report(small: bool, rate: float, line) -> None:
    from benchmarks.backfill_sim import SMALL, Shape, compare

    shape = SMALL if small else Shape()
    shape = Shape(**{**shape.__dict__, "load": rate})
    t0 = time.perf_counter()
    out = compare(shape)
    before, after = out["before"], out["after"]
    print(f"backfill replay: {shape.nodes} nodes x 8 GPUs, {shape.seconds / 3600:.2f} simulated h, load "
          f"{shape.load}x, {after['submitted']} claims, {time.perf_counter() - t0:.1f} s wall, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    line(after["idle"] <= before["idle"] / 2,
         f"GPU-idle on held nodes: {before['idle'] * 100:.1f} % space-only, {after['idle'] * 100:.1f} % with "
         f"backfill ({after['backfilled']} claims backfilled) (goal: halved or better)")
    print("       estimate error = |estimated start - actual start| / actual wait (submission to start), the "
          "estimate being the planned start a claim got when it first became a planned claim; over the planned "
          f"claims that waited after that ({after['started_at_once']} more started in the round that first "
          "planned them, on time)")
    for key, goal in (("error_median", 0.10), ("error_p90", 0.25)):
        err = after[key]
        line(err is not None and err <= goal and after["estimated"] >= 100,
             f"estimate error {key[6:]} over {after['estimated']} planned claims that waited: "
             f"{'none' if err is None else f'{err * 100:.1f} %'} (goal <= {goal * 100:.0f} %, >= 100 claims)")
    sizes = ", ".join(f"{n}-GPU: {c} claims, median {m * 100:.1f} %, p90 {p * 100:.1f} %"
                      for n, (c, m, p) in after["by_size"].items())
    print(f"       by size: {sizes}")
    if after["strict_median"] is not None:
        print(f"       the same error over the wait from the estimate to the start (what it predicted): median "
              f"{after['strict_median'] * 100:.1f} %, p90 {after['strict_p90'] * 100:.1f} % (no goal)")
    line(after["delayed"] == 0, f"heads delayed by a backfilled claim: {after['delayed']} (goal 0)")


def reservation_report(small: bool, rate: float | None, line) -> None:
    from benchmarks.reservation_sim import SMALL, Replay, Shape

    shape = SMALL if small else Shape()
    if rate is not None:
        shape = Shape(**{**shape.__dict__, "load": rate})
    t0 = time.perf_counter()
    out = Replay(shape).run()
    print(f"reservation replay: {shape.nodes} nodes x 8 GPUs, a {shape.reserved}-GPU window {shape.window[0][11:16]}-"
          f"{shape.window[1][11:16]} {shape.zone} daily (lead {shape.lead} s, lendIdle {shape.lend_idle}), "
          f"{shape.days} simulated days, offered load {shape.load}x, {out['claims']} claims, fleet "
          f"{out['busy'] * 100:.1f} % busy overall, {time.perf_counter() - t0:.1f} s wall, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for day in out["days"]:
        late = day["late"]
        line(late is not None and late <= 5 and day["busy_before"] >= 0.9 and not day["short"],
             f"window {day['start']:%Y-%m-%d %H:%M} UTC: fleet {day['busy_before'] * 100:.1f} % busy in the hour "
             f"before its hold (goal >= 90 %), {day['held']} of {shape.reserved} GPUs held"
             + (f" ({'; '.join(day['short'])})" if day["short"] else "")
             + f", its {shape.reserved} GPUs of claims all started "
             + ("NEVER" if late is None else f"{late:.1f} s late") + " (goal <= 5 s)")
    line(len(out["days"]) == shape.days, f"windows replayed: {len(out['days'])} (goal {shape.days})")
    idle = out["idle_gpu_hours"]
    print(f"       reserved {out['reserved_gpu_hours']:.0f} GPU-h: its claims used {out['own_gpu_hours']:.0f}, "
          f"idle {idle:.0f}; lent out inside the windows (lendIdle, claims ending before the end) "
          f"{out['lent_inside_gpu_hours']:.0f} GPU-h ({out['lent_inside_gpu_hours'] / idle * 100 if idle else 0:.0f} "
          f"% of the idle); on held nodes during the lead times (claims ending before the start) "
          f"{out['lent_before_gpu_hours']:.0f} GPU-h")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--minutes", type=int, default=120)
    parser.add_argument("--rate", type=float, default=None, help="offered load as a multiple of the fleet "
                                                                   "(default 1.3; --reservation: 1.0)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--backfill", action="store_true", help="the walltime backfill replay only (issue 37)")
    parser.add_argument("--reservation", action="store_true", help="the advance-reservation replay only (issue 38)")
    parser.add_argument("--small", action="store_true", help="with --backfill: 40 nodes, an hour; with "
                                                             "--reservation: 48 nodes, 2 days")
    args = parser.parse_args()
    args.rate_given = args.rate is not None
    args.rate = 1.3 if args.rate is None else args.rate
    missed = []

    def line(ok: bool, text: str) -> None:
        print(f"{'met   ' if ok else 'MISSED'} {text}")
        if not ok:
            missed.append(text)

    if args.reservation:
        reservation_report(args.small, args.rate if args.rate_given else None, line)
        return 1 if args.check and missed else 0
    if args.backfill:
        backfill_report(args.small, args.rate, line)
        return 1 if args.check and missed else 0
    t0 = time.perf_counter()
    out = fair_share(args.nodes, args.minutes, args.rate)
    print(f"replay: {args.nodes} nodes x 8 H100, {args.minutes} simulated minutes, load {args.rate}x, "
          f"{time.perf_counter() - t0:.1f} s wall")
    for name, share in out["share"].items():
        gap = abs(share - out["fair"][name]) * 100
        line(gap <= 5, f"queue {name}: {share * 100:.1f} % of the GPU-hours beyond nominal, fair share "
                       f"{out['fair'][name] * 100:.1f} % (gap {gap:.1f} pp, goal <= 5)")
    print(f"       preemptions: {out['preemptions']}")
    err = out["estimate_error"]
    shown = f"{err * 100:.0f} %" if err is not None else "none"
    line(err is not None and err <= 0.2,
         f"start-time estimate error, median over {out['estimated']} claims that waited: {shown} (goal <= 20 %)")
    times = sorted(reclaim_time(args.nodes))
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    line(p99 < 1.0, f"reclaim decision, 1-GPU claim, {args.nodes * 8} claims running: p50 "
                    f"{statistics.median(times) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (goal p99 < 1 s; KAI 13.9 s)")
    times, sources = tree_reclaim_time(args.nodes)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    line(p99 < 1.0 and sources <= {"A1", "A2"},
         f"fair-share reclaim in a two-level tree (org-a {{A1, A2}} vs org-b {{B1}}), 1-GPU claim, "
         f"{args.nodes * 8} claims running: p50 {statistics.median(times) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
         f"victims from {sorted(sources)} (goal p99 < 1 s, victims from org-a's subtree only)")
    seconds, victims, placed = gang_reclaim(args.nodes)
    line(placed and seconds < 10, f"reclaim for a {args.nodes // 2} x 8-GPU gang of queue D (nominal "
                                  f"{args.nodes * 4}) from borrowers: {seconds:.2f} s, {victims} victims, "
                                  f"{'placed' if placed else 'NOT placed'} (goal < 10 s; KAI 102 s)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
