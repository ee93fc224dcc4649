"""A recorded window replayed on a virtual clock through the scheduler's decision code; nothing is written.

The pieces are the service's own, as in ``benchmarks/queue_bench.py``: the ``dra.engine`` places on a copy of
today's fleet, ``queues.services.admission``'s quota check admits (on the replay's usage, not the database's
charges), ``queues.services.order`` ranks the queues (Kueue's "under nominal first", then fair share, with
decayed usage kept on the virtual clock as ``usage.services.decay`` keeps it on the real one), and
``scheduler.services.preemption.confirm_with_engine`` chooses the victims a queue within its nominal reclaims
from borrowers (grace 0: a victim waits again at its place and later runs its whole duration again).

A round runs whenever something happened (an arrival, a release, a withdrawal, a configuration change),
rounds at most ``ROUND_SECONDS`` apart in virtual time, as the service's round follows a release within about
a second. The configuration in force changes at each epoch's start (``replay_trace.epochs``); queue ids are
kept by name across epochs so usage carries over. The replay stops with ``BudgetExceeded`` once it has used
``budget`` seconds of CPU. Not replayed: head-of-queue holds and backfill, gangs, defragmentation moves,
preemption grace periods and reservations' held capacity (a reservation's use is counted, not enforced).
"""
from __future__ import annotations

import bisect
import heapq
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

from claims.services import queueing
from dra.engine import ClaimGroup, Engine, FleetSnapshot
from queues import spec as queue_spec
from queues.models import Queue
from queues.services import order
from queues.services import usage as u
from queues.services.admission import _State
from queues.services.resolve import Tree, effective_priority, queue_of
from scheduler.services.preemption import confirm_with_engine
from scheduler.services.replay_trace import Held, Trace, TraceClaim
from usage.services.decay import decayed as decay_to

ROUND_SECONDS = 0.05


def _key(sim: SimClaim) -> tuple:
    """``bisect``'s key: a pending list stays in queue order as claims arrive or are requeued (no sort per round)."""
    return sim.key


class BudgetExceeded(Exception):
    pass


@dataclass
class SimClaim:
    id: int
    trace: TraceClaim
    queue: str
    priority: int
    arrival: float
    spec: dict
    labels: dict
    created_at: object
    started: float | None = None
    first_start: float | None = None
    devices: list = field(default_factory=list)
    charges: list = field(default_factory=list)
    weight: float = 0.0
    shape: str = ""  # the spec as a key: claims of one shape that found no room need not be tried again
    fresh: bool = True  # never tried since it arrived (or was requeued): the next round tries it
    wants: tuple = ()  # (deviceClassName, devices) it asks for (``usage.requested_devices``)
    gone: bool = False  # withdrawn by its user

    @property
    def key(self) -> tuple:
        """Its place in its queue (a pending list is kept in this order)."""
        return (-self.priority, self.arrival, self.id)

    def group(self) -> ClaimGroup:
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": self.trace.name, "namespace": self.trace.namespace, "uid": self.trace.uid},
                 "spec": self.spec}
        return ClaimGroup(claims=[claim], key=f"r{self.id}")


class _View:
    """What admission reads of a fleet view."""

    def __init__(self, snapshot: FleetSnapshot, labels: list[tuple[str, dict]]) -> None:
        self.snapshot, self.key, self.cluster_labels = snapshot, ("replay",), labels


class _Placement:
    def __init__(self, claim: SimClaim, allocation: dict, cluster: str) -> None:
        self.claims, self.allocations, self.cluster = [claim], [allocation], cluster


class _Unit:
    def __init__(self, claim: SimClaim, allocation: dict, cluster: str) -> None:
        self.placements = [_Placement(claim, allocation, cluster)]


class _Shares(order.Shares):
    """``order.Shares`` that works out a queue's share (``ranked``) once until the next ``add``: a round ranks a
    queue for each shape of claim it passes, on the same use."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ranked: dict[int, Fraction | float] = {}

    def add(self, qid: int, cls: str, n: int) -> None:
        self._ranked.clear()
        super().add(qid, cls, n)

    def ranked(self, queue) -> Fraction | float:
        found = self._ranked.get(queue.id)
        if found is None:
            found = self._ranked[queue.id] = super().ranked(queue)
        return found


def tree_of(specs: dict[str, dict], ids: dict[str, int]) -> Tree:
    """Unsaved queues from specs; ids kept by name (``ids`` grows for names it has not seen)."""
    queues = {}
    for name in sorted(specs):
        ids.setdefault(name, len(ids) + 1)
    for name, spec in specs.items():
        queues[name] = Queue(id=ids[name], name=name, spec=spec, weight=float(spec.get("weight", 1)),
                             priority=int(spec.get("priority", 0)), max_priority=int(spec.get("maxPriority", 0)))
    for q in queues.values():
        parent = q.spec.get("parent")
        q.parent_id = ids.get(parent) if parent in queues else None
    if "default" not in queues:
        spec, _ = queue_spec.normalize({"metadata": {"name": "default"}})
        ids.setdefault("default", len(ids) + 1)
        queues["default"] = Queue(id=ids["default"], name="default", spec=spec["spec"])
    by_namespace = {ns: q.name for q in queues.values() for ns in q.spec.get("namespaces") or []}
    return Tree(queues=queues, by_namespace=by_namespace, _redirects={})


class Replay:
    def __init__(self, trace: Trace, snapshot: FleetSnapshot, cluster_labels: list[tuple[str, dict]],
                 decayed0: dict[str, float], budget: float, samples: int = 24, fanout: int = 4) -> None:
        self.trace = trace
        self.seconds = (trace.end - trace.start).total_seconds()
        self.engine = Engine(snapshot)
        self.view = _View(snapshot, cluster_labels)
        self.ids: dict[str, int] = {}
        self.epoch = 0
        self.tree = tree_of(trace.epochs[0][1].get("Queue", {}), self.ids)
        self.usage: dict = defaultdict(Fraction)
        self.state = self._state()
        self.decay: dict[str, tuple[float, float]] = {q: (v, 0.0) for q, v in decayed0.items()}  # (U, at)
        self.budget, self.cpu0 = budget, time.process_time()
        self.pending: dict[str, list[SimClaim]] = defaultdict(list)  # in queue order (``SimClaim.key``)
        self.fresh: list[SimClaim] = []  # made fresh since the last round
        self.running: list[tuple[float, int, SimClaim]] = []  # (end, id, claim)
        self.background: list[tuple[float, int, Held]] = []
        self.claims: list[SimClaim] = []
        self.preempted: dict[str, int] = defaultdict(int)
        self.device_seconds: dict[str, float] = defaultdict(float)
        self.reserved_seconds: dict[str, float] = defaultdict(float)
        self.samples: list[dict] = []
        self.sample_every = max(1.0, self.seconds / max(1, samples))
        self.rounds = 0
        self.classes: dict[str, str] = {}  # driver -> DeviceClass name
        # Targeted wake-ups (``scheduler.services.wakeups``): a round tries the claims never tried and, of the
        # others, as many as WAKE_FANOUT per device freed since the round before, in queue order; a
        # configuration change wakes them all (as a queue write bumps the fleet's version).
        self.fanout = fanout
        # Bumped whenever the engine, the usage, the running claims or the configuration change: a queue's head
        # that reclaimed nothing at one version reclaims nothing at the same version again (``_reclaim``).
        self.version = 0
        self.reclaimed_at: dict[str, tuple[int, int]] = {}  # queue -> (its head's id, version) tried
        self.nominals: dict[tuple[str, str], Fraction] = {}  # (queue, class) -> nominal devices, this epoch
        self._failed: dict[str, int] = {}  # the round's: shape -> starts when it found no room
        self._blocked: set[tuple[str, str]] = set()  # the round's: (queue, shape) its quota refused
        self._successes = 0  # the round's starts
        self._shares: _Shares | None = None  # the round's, while queues are ranked
        self._started_in: set[str] = set()  # the round's: queues that started a claim
        self._fresh: dict[str, list[SimClaim]] = {}  # the round's: fresh claims per queue, in its order
        self.freed = 0
        self.wake_all = True

    def _state(self) -> _State:
        state = _State(self.tree, self.view, None)
        state._usage = self.usage
        return state

    # ------------------------------------------------------------------------------------------- the clock
    def run(self) -> None:
        for i, held in enumerate(self.trace.background):
            self.engine.commit(held.devices)
            self._charge_background(held, +1)
            heapq.heappush(self.background, (held.end if held.end is not None else float("inf"), i, held))
        arrivals = sorted(self.trace.claims, key=lambda c: (max(0.0, c.arrival), c.created_at, c.uid))
        # Claims that never ran leave when their user gave up on them; the others run their recorded duration
        # whenever the replay starts them.
        withdrawals = sorted((c.ended, i) for i, c in enumerate(self.trace.claims)
                             if c.ended is not None and not c.runs)
        by_uid: dict[str, SimClaim] = {}
        k = w = 0
        now, next_sample = 0.0, 0.0
        while now <= self.seconds:
            self._check_budget()
            self._switch_epoch(now)
            self._release(now)
            while k < len(arrivals) and max(0.0, arrivals[k].arrival) <= now:
                sim = self._arrive(arrivals[k])
                by_uid[sim.trace.uid] = sim
                k += 1
            while w < len(withdrawals) and withdrawals[w][0] <= now:
                self._withdraw(by_uid.get(self.trace.claims[withdrawals[w][1]].uid), now)
                w += 1
            self._round(now)
            self._reclaim(now)
            while next_sample <= now:
                self._sample(next_sample)
                next_sample += self.sample_every
            upcoming = [self.seconds + 1, next_sample]
            if k < len(arrivals):
                upcoming.append(max(0.0, arrivals[k].arrival))
            if w < len(withdrawals):
                upcoming.append(withdrawals[w][0])
            if self.running:
                upcoming.append(self.running[0][0])
            if self.background:
                upcoming.append(self.background[0][0])
            if self.epoch + 1 < len(self.trace.epochs):
                upcoming.append(self.trace.epochs[self.epoch + 1][0])
            now = max(now + ROUND_SECONDS, min(upcoming))
        self._close(self.seconds)

    def _check_budget(self) -> None:
        self.rounds += 1
        if time.process_time() - self.cpu0 > self.budget:
            raise BudgetExceeded(f"stopped after {self.budget:.0f} s of CPU ({self.rounds} rounds)")

    def _switch_epoch(self, now: float) -> None:
        while self.epoch + 1 < len(self.trace.epochs) and self.trace.epochs[self.epoch + 1][0] <= now:
            self.epoch += 1
            self.tree = tree_of(self.trace.epochs[self.epoch][1].get("Queue", {}), self.ids)
            self.state = self._state()
            self.wake_all = True
            self.version += 1
            self.nominals = {}

    def half_life(self, queue: str) -> float:
        q = self.tree.queues.get(queue)
        return float(queue_spec.half_life(q.spec)) if q is not None else 0.0

    def decayed(self, now: float) -> dict[str, float]:
        out = {}
        for name in self.tree.queues:
            h = self.half_life(name)
            if h > 0:
                value, at = self.decay.get(name, (0.0, now))
                out[name] = decay_to(value, at, h, now)
        return out

    def _used(self, queue: str, seconds: float, now: float) -> None:
        """``seconds`` device-seconds closed at ``now`` for ``queue``: its decayed usage grows (any half-life
        that queue has then; one without keeps the sum, as the ledger does)."""
        h = self.half_life(queue)
        value, at = self.decay.get(queue, (0.0, now))
        self.decay[queue] = ((decay_to(value, at, h, now) if h > 0 else value) + seconds, now)

    # ------------------------------------------------------------------------------------------- claims
    def _arrive(self, c: TraceClaim) -> SimClaim:
        named = queue_of(c, c.namespace, self.tree) if c.labels is not None else "default"
        sim = SimClaim(len(self.claims) + 1, c, named, 0, c.arrival, c.spec, c.labels, c.created_at)
        sim.priority = effective_priority(sim, self.tree.queues.get(named))
        sim.shape = json.dumps(c.spec, sort_keys=True)
        sim.wants = tuple(u.requested_devices(c.spec))
        self.claims.append(sim)
        self._queue(sim)
        return sim

    def _queue(self, sim: SimClaim) -> None:
        sim.fresh = True
        bisect.insort(self.pending[sim.queue], sim, key=_key)
        self.fresh.append(sim)

    def _withdraw(self, sim: SimClaim | None, now: float) -> None:
        """Released or deleted by its user: gone from the queue, or (started in the replay but never in fact)
        given back now."""
        if sim is None:
            return
        if sim.started is None:
            sim.gone = True
            if sim in self.pending[sim.queue]:
                self.pending[sim.queue].remove(sim)
        elif not sim.trace.runs:
            self.running = [r for r in self.running if r[2] is not sim]
            heapq.heapify(self.running)
            self._stop(sim, now)

    def _release(self, now: float) -> None:
        while self.running and self.running[0][0] <= now:
            _, _, sim = heapq.heappop(self.running)
            self._stop(sim, now)
        while self.background and self.background[0][0] <= now:
            _, _, held = heapq.heappop(self.background)
            self.engine.release(held.devices)
            self.version += 1
            self.freed += len(held.devices)
            self._charge_background(held, -1)
            self._used(held.queue, held.weight * now, now)
            self.device_seconds[held.queue] += held.weight * now

    def _charge_background(self, held: Held, sign: int) -> None:
        qid = self.ids.get(held.queue)
        if qid is None:
            return
        for d in held.devices:
            self.usage[(qid, self._class_of(d), "devices", "", d.cluster)] += sign * Fraction(1)

    def _class_of(self, device) -> str:
        """The quota class of a device held at the start: the first DeviceClass of the fleet naming its driver
        (the ledger keeps no class)."""
        if device.driver not in self.classes:
            self.classes[device.driver] = next(
                (c["metadata"]["name"] for c in self.view.snapshot.device_classes
                 if f'\\"{device.driver}\\"' in json.dumps(c.get("spec") or {})), "")
        return self.classes[device.driver]

    def _start(self, sim: SimClaim, now: float) -> str:
        """"Started", or why not ("room", "quota")."""
        outcome = self.engine.allocate(sim.group(), raise_errors=False, explain=False)
        if not outcome.allocated:
            return "room"
        cluster = outcome.cluster or ""
        verdict, charges = self.state.try_admit(_Unit(sim, outcome.claims[0].allocation or {}, cluster), sim.queue)
        if verdict.reason != queueing.ADMITTED:
            self.engine.release(outcome.devices)
            return "quota"
        self.version += 1
        sim.devices, sim.charges, sim.started = list(outcome.devices), charges, now
        sim.first_start = now if sim.first_start is None else sim.first_start
        sim.weight = float(sum(1 for d in outcome.devices if not d.admin_access))
        duration = sim.trace.duration
        heapq.heappush(self.running, (now + duration if duration is not None else float("inf"), sim.id, sim))
        return "Started"

    def _stop(self, sim: SimClaim, now: float) -> None:
        self.version += 1
        self.engine.release(sim.devices)
        self.freed += len(sim.devices)
        for ch in sim.charges:
            key = (ch.queue_id, ch.device_class, ch.unit, ch.resource, ch.cluster)
            self.usage[key] -= Fraction(ch.amount)
        held = sim.weight * (now - (sim.started or 0.0))
        self._used(sim.queue, held, now)
        self.device_seconds[sim.queue] += held
        reservation = (sim.labels or {}).get("draservice.io/reservation")
        if reservation:
            self.reserved_seconds[reservation] += held
        sim.started, sim.devices, sim.charges = None, [], []

    def _close(self, now: float) -> None:
        for _, _, sim in list(self.running):
            self._stop(sim, now)
        for _, _, held in self.background:
            self.device_seconds[held.queue] += held.weight * now

    # ------------------------------------------------------------------------------------------- the round
    def _round(self, now: float) -> None:
        """Each queue's pending claims in turn, the queues in fair-share order (``order._rank`` of the queue for
        its next claim), as the service's round takes them. Only some claims are tried (the fresh ones and
        ``woken`` others); the others are passed over with no effect, so once no claim is woken any more and
        only one queue still has fresh claims ahead, the order among queues no longer matters: that queue's
        fresh claims are tried in its order and the round ends (without walking the backlog every round)."""
        fresh: dict[str, list[SimClaim]] = defaultdict(list)  # per queue, in its order
        for sim in sorted({id(s): s for s in self.fresh}.values(), key=_key):
            if sim.fresh and sim.started is None and not sim.gone:
                fresh[sim.queue].append(sim)
        fresh_left = {q: len(sims) for q, sims in fresh.items()}
        self.fresh, self._fresh = [], fresh
        woken = float("inf") if self.wake_all or self.fanout <= 0 else self.fanout * self.freed
        self.freed, self.wake_all = 0, False
        self._failed, self._blocked, self._successes = {}, set(), 0
        self._shares, self._started_in = None, set()
        if woken > 0 or not self._fresh_only(fresh_left, now):
            self._merge(woken, fresh_left, now)
        for name in self._started_in:
            self.pending[name] = [s for s in self.pending[name] if s.started is None]

    def _fresh_only(self, fresh_left: dict[str, int], now: float) -> bool:
        """With no claim woken: when at most one queue has fresh claims ahead, try them (the rest of the round);
        False when more than one has (their order depends on the queues' ranks)."""
        ahead = [q for q, n in fresh_left.items() if n > 0]
        if len(ahead) > 1:
            return False
        for sim in self._fresh[ahead[0]] if ahead else ():
            if sim.fresh:  # not passed yet (those the walk passed are no longer fresh)
                sim.fresh = False
                self._try(sim, now)
        return True

    def _merge(self, woken: float, fresh_left: dict[str, int], now: float) -> None:
        """The round's walk over the queues in rank order (see ``_round``)."""
        shares = self._shares = _Shares(self.tree, self.usage, self.decayed(now))
        queues = {q: items for q, items in self.pending.items() if items}
        ranks: dict[tuple[str, tuple], tuple] = {}  # (queue, wants) -> its rank: until the next start

        def rank(name: str, wants: tuple) -> tuple:
            found = ranks.get((name, wants))
            if found is None:
                found = ranks[(name, wants)] = order._rank(self.tree, shares, name, wants) + (name,)
            return found

        heap = [rank(q, items[0].wants) for q, items in queues.items()]
        heapq.heapify(heap)
        pos = dict.fromkeys(queues, 0)
        while heap:
            if woken <= 0 and self._fresh_only(fresh_left, now):
                return
            name = heapq.heappop(heap)[-1]
            sim = queues[name][pos[name]]
            pos[name] += 1
            tried = sim.fresh or woken > 0
            if sim.fresh:
                fresh_left[name] -= 1
            elif tried:
                woken -= 1
            sim.fresh = False
            successes = self._successes
            if tried:
                self._try(sim, now)
            if self._successes != successes:
                ranks.clear()
            if pos[name] < len(queues[name]):
                heapq.heappush(heap, rank(name, queues[name][pos[name]].wants))

    def _try(self, sim: SimClaim, now: float) -> None:
        """Start ``sim`` unless a claim of its shape found no room since the last start, or its queue's quota
        refused its shape this round."""
        shape, name = sim.shape, sim.queue
        if self._failed.get(shape) == self._successes or (name, shape) in self._blocked:
            return
        why = self._start(sim, now)
        if why == "Started":
            self._successes += 1
            self._started_in.add(name)
            queue = self.tree.queues.get(name)
            if queue is not None and self._shares is not None:  # None: no queue is ranked again this round
                for cls, n in sim.wants:
                    self._shares.add(queue.id, cls, n)
        elif why == "room":
            self._failed[shape] = self._successes
        else:
            self._blocked.add((name, shape))

    def _reclaim(self, now: float) -> None:
        """A queue whose head waits within its nominal reclaims from the borrowers (``reclaimWithinCohort``
        Never: it does not)."""
        for name, items in self.pending.items():
            if not items:
                continue
            queue = self.tree.queues.get(name)
            if queue is None or (queue.spec.get("preemption") or {}).get("reclaimWithinCohort") == "Never":
                continue
            head = items[0]
            if self.reclaimed_at.get(name) == (head.id, self.version):
                continue  # nothing changed since this head reclaimed nothing
            self.reclaimed_at[name] = (head.id, self.version)
            wants = head.wants
            if len(wants) != 1:
                continue
            cls, need = wants[0]
            if self._in_use(queue.id, cls) + need > self._nominal(queue, cls):
                continue
            nominal = {q.id: self._nominal(q, cls) for q in self.tree.queues.values()}
            used = {q.id: self._in_use(q.id, cls) for q in self.tree.queues.values()}
            borrowing = {q.name for q in self.tree.queues.values() if q.name != name and used[q.id] > nominal[q.id]}
            pool = sorted((s for _, _, s in self.running if s.queue in borrowing),
                          key=lambda s: (-(s.started or 0.0), s.id))
            if not pool:
                continue
            held = {s.id: (self.tree.queues[s.queue].id, Fraction(int(s.weight))) for s in pool}
            victims = confirm_with_engine(self.engine, head.group(), pool, need, held, used, nominal, queue.id,
                                          {s.id: s.devices for s in pool})
            if not victims:
                continue
            ids = {v.id for v in victims}
            self.running = [r for r in self.running if r[1] not in ids]
            heapq.heapify(self.running)
            for v in victims:
                self._stop(v, now)
                self.preempted[v.queue] += 1
                self._queue(v)
            if self._start(head, now) == "Started":
                items.remove(head)

    def _nominal(self, queue: Queue, cls: str) -> Fraction:
        found = self.nominals.get((queue.name, cls))
        if found is None:
            found = self.nominals[(queue.name, cls)] = self._nominal_of(queue, cls)
        return found

    def _nominal_of(self, queue: Queue, cls: str) -> Fraction:
        total = Fraction(0)
        for entry in queue.spec.get("quotas") or []:
            if entry.get("deviceClassName") == cls and (entry.get("devices") or {}).get("nominal") is not None:
                total += Fraction(queue_spec.amount_of(entry["devices"]["nominal"]))
        return total

    def _in_use(self, qid: int, cls: str) -> Fraction:
        return sum((a for (q, c, unit, _, _), a in self.usage.items() if q == qid and c == cls and unit == "devices"),
                   Fraction(0))

    def _sample(self, at: float) -> None:
        shares = order.Shares(self.tree, self.usage, self.decayed(at))
        queues = [q for q in self.tree.queues.values() if self.tree.is_leaf(q.name)]
        ranks = order.fair_share_ranks(queues, shares)
        decayed = shares.decayed
        self.samples.append({"at": at, "queues": {
            q.name: {"rank": ranks[q.id], "effectiveShare": float(shares.ranked(q)),
                     "decayedUsage": decayed.get(q.name), "weight": q.weight} for q in queues}})
