"""Advance-reservation replay: a daily window of held GPUs on a busy fleet, for some simulated days.

A virtual-clock replay (rounds on the lease sweep's period; a period where nothing arrives, ends or crosses a
window's edge is skipped: nothing would change in it) of what the scheduler does for a reservation, with its
own pieces: ``dra.engine`` places; ``dra.windows`` expands the window (its occurrences in its time zone) and
decides with the scheduler's rules -- ``free_by_start`` (which running claims count free when the hold is
chosen: ``scheduler.services.reservation_tick``) and ``may_use_held`` (which claims may land on held capacity:
``scheduler.services.reservations.ReservationScreen``); ``queues.services.reservation_fit.place`` chooses the
held nodes as the reservations' pass does (nodes running what would be taken last).

The round mirrors the screen and ``scheduler.services.allocation``: a claim labelled for the reservation waits
outside its window and inside it tries the held nodes first; any other claim tries the held nodes last, and a
placement that lands on one is undone unless ``may_use_held`` lets it stay (before the start: its walltime
ends by the start; inside the window, with ``lendIdle`` and none of the reservation's own claims waiting: by
the end). The reservation's own claims (8-GPU ones, submitted before the start) run part of the window: the
rest of its capacity is idle, and lent out to claims that end before the end.

Measured per occurrence: how busy the fleet was in the hour before its hold, the GPUs held, and how late its
claims all started (the delay on the virtual clock plus, as its worst case, the reservations' pass period and
a round's latency: the pass wakes the waiting claims, a round places them); over all: reserved GPU-hours, those
its claims used, and the idle ones lent out.
"""
from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from benchmarks.backfill_sim import CLUSTER, GPUS, LATENCY, MARGIN, SWEEP, Job, fleet
from dra import windows
from queues.services import reservation_fit as fit

TICK = 2.0  # the reservations' pass period (scheduler.services.reservation_tick.TICK_SECONDS)
NAME = "nightly"
CLASS = "gpu"  # backfill_sim's fleet's device class


@dataclass(frozen=True)
class Shape:
    nodes: int = 128
    reserved: int = 256  # GPUs
    days: int = 5
    load: float = 1.0  # offered GPU demand as a multiple of the fleet (with the window, more than it holds)
    lead: int = 3600
    window: tuple[str, str] = ("2026-12-01T02:00:00", "2026-12-01T06:00:00")
    zone: str = "Europe/Berlin"
    warmup: float = 8 * 3600.0  # simulated before the first hold
    own_full: float = 0.75  # of the reserved GPUs, those its claims use for the whole window (the rest 1-2 h)
    no_walltime: float = 0.05
    early: float = 0.1
    lend_idle: bool = True
    seed: int = 1


SMALL = Shape(nodes=48, reserved=96, days=2, warmup=4 * 3600.0)


@dataclass
class Booked(Job):
    reservation: str = ""  # the label: its claims run in the reservation


class Replay:
    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.engine = fleet(shape.nodes)
        self.window, _, errors = windows.parse({"start": shape.window[0], "end": shape.window[1],
                                                "timeZone": shape.zone, "recurrence": {"frequency": "Daily"}})
        assert self.window is not None, errors
        first = next(windows.occurrences(self.window, datetime(2000, 1, 1, tzinfo=UTC), datetime.max.replace(
            tzinfo=UTC)))
        self.t0 = first.start.timestamp() - shape.lead - shape.warmup
        span = shape.warmup + shape.lead + shape.days * 86400.0
        self.occs = [(o.start.timestamp() - self.t0, o.end.timestamp() - self.t0, o.start)
                     for o in windows.occurrences(self.window, first.start, first.start.replace(
                         year=first.start.year + 1))][:shape.days]
        self.seconds = min(span, self.occs[-1][1] + 600.0)
        self.spec = {"resources": [{"deviceClassName": CLASS, "devices": shape.reserved}],
                     "leadTimeSeconds": shape.lead, "lendIdle": shape.lend_idle}
        self.rng = random.Random(shape.seed)
        self.incoming = self.arrivals()
        self.pending: list[Booked] = []
        self.running: list[tuple[float, int, Booked]] = []  # (release time, id, job)
        self.held: frozenset[tuple[str, str]] = frozenset()
        self.occ: tuple[float, float, datetime] | None = None  # the occurrence being held
        self.days: list[dict] = []
        self.used_gpus = 0
        self.own_waiting = False
        self.gpu_seconds = {"busy": 0.0, "own": 0.0, "lent_inside": 0.0, "lent_before": 0.0}
        self.before: dict[int, float] = defaultdict(float)  # occurrence -> busy GPU-seconds in the hour before
        self.nodes = [(CLUSTER, f"n{i:04d}") for i in range(shape.nodes)]

    # ----------------------------------------------------------------------------------------- the claims
    def arrivals(self) -> list[Booked]:
        """Poisson arrivals sized so that GPU demand is ``load`` x the fleet (1-8 GPUs, 10 min-3 h walltimes;
        some without a walltime, some ending early); and each occurrence's own claims, 10 minutes before it."""
        s, rng = self.shape, self.rng
        sizes, mean_seconds = (1, 2, 4, 8), (10 + 180) / 2 * 60
        rate = s.load * s.nodes * GPUS / (sum(sizes) / len(sizes) * mean_seconds)
        jobs: list[Booked] = []
        now = 0.0
        while True:
            now += rng.expovariate(rate)
            if now >= self.seconds:
                break
            wall = rng.uniform(10, 180) * 60
            runs = wall * rng.uniform(0.5, 1.0) if rng.random() < s.early else wall
            known = None if rng.random() < s.no_walltime else wall
            jobs.append(Booked(0, "q", rng.choice(sizes), known, runs, now))
        for start, end, _ in self.occs:
            full = s.reserved * s.own_full // GPUS
            for i in range(s.reserved // GPUS):
                runs = (end - start) if i < full else rng.uniform(3600, 7200)
                jobs.append(Booked(0, "team-r", GPUS, end - start, runs, start - 600, reservation=NAME))
        jobs.sort(key=lambda j: j.submitted)
        for i, j in enumerate(jobs, start=1):
            j.id = i
        return jobs

    # ----------------------------------------------------------------------------------------- the clock
    def run(self) -> dict:
        k, now, last = 0, 0.0, 0.0
        edges = sorted({t for start, end, _ in self.occs for t in (start - self.shape.lead, start, end)})
        while now < self.seconds:
            self.account(last, now)
            last = now
            while k < len(self.incoming) and self.incoming[k].submitted <= now:
                self.pending.append(self.incoming[k])
                k += 1
            self.release(now)
            self.edges(now)
            self.round(now)
            now = self.next_step(now, k, edges)
        self.account(last, self.seconds)
        return self.figures()

    def next_step(self, now: float, k: int, edges: list[float]) -> float:
        """The next sweep period in which something happens (an arrival, a walltime's or a run's end, a
        window's edge)."""
        soon = [self.seconds]
        if k < len(self.incoming):
            soon.append(self.incoming[k].submitted)
        if self.running:
            soon.append(self.running[0][0])
        soon += [t for t in edges if t > now][:1]
        at = max(now + SWEEP, min(soon))
        return -(-at // SWEEP) * SWEEP

    def account(self, since: float, until: float) -> None:
        dt = until - since
        if dt <= 0:
            return
        self.gpu_seconds["busy"] += self.used_gpus * dt
        for i, (start, _, _) in enumerate(self.occs):
            hold = start - self.shape.lead
            lo, hi = max(since, hold - 3600), min(until, hold)
            if hi > lo:
                self.before[i] += self.used_gpus * (hi - lo) * 1.0
        if self.occ is None or not self.held:
            return
        start, end, _ = self.occ
        own = sum(j.count for _, _, j in self.running if j.reservation and j.started is not None)
        lent = sum(j.count for _, _, j in self.running if not j.reservation and (CLUSTER, j.node) in self.held)
        if since >= start:
            self.gpu_seconds["own"] += own * dt
            self.gpu_seconds["lent_inside"] += lent * dt
        else:
            self.gpu_seconds["lent_before"] += lent * dt

    def release(self, now: float) -> None:
        while self.running and self.running[0][0] <= now:
            job = heapq.heappop(self.running)[2]
            self.engine.release(job.devices)
            self.used_gpus -= job.count

    def edges(self, now: float) -> None:
        """The reservations' pass: the hold from start - lead (chosen once), dropped after the end."""
        if self.occ is not None and now >= self.occ[1]:
            self.occ, self.held = None, frozenset()
        for i, (start, end, when) in enumerate(self.occs):
            if start - self.shape.lead <= now < end and self.occ is None:
                self.occ = (start, end, when)
                self.hold(i, start)

    def hold(self, i: int, start: float) -> None:
        """As ``reservation_tick.hold``: devices of claims free by the start count free; the nodes running the
        fewest of those are tried first."""
        free = [j for _, _, j in self.running if j.reservation == NAME or windows.free_by_start(
            None if j.walltime is None or j.started is None else j.started + j.walltime, start, MARGIN)]
        busy: dict[tuple[str, str], int] = defaultdict(int)
        for j in free:
            self.engine.release(j.devices)
            busy[(CLUSTER, j.node)] += j.count
        placed = fit.place(self.engine, [(CLUSTER, {})], NAME, self.spec, busy)
        self.engine.release(placed.devices)
        for j in free:
            self.engine.commit(j.devices)
        self.held = frozenset(placed.nodes)
        self.days.append({"start": self.occs[i][2], "held": len(placed.devices), "short": placed.short,
                          "busy_before": self.before[i] / (3600 * self.shape.nodes * GPUS), "last_start": None,
                          "own": 0})

    # ----------------------------------------------------------------------------------------- the round
    def round(self, now: float) -> None:
        # As the screen reads it once a round: its own claims wait for room while it holds less than it reserves.
        self.own_waiting = any(j.reservation for j in self.pending) and sum(
            j.count for _, _, j in self.running if j.reservation) < self.shape.reserved
        failed: dict[tuple[int, str], float] = {}  # (count, label) -> the shortest walltime that found no room
        waiting = []
        for job in self.pending:
            wall = job.walltime if job.walltime is not None else float("inf")
            key = (job.count, job.reservation)
            if wall >= failed.get(key, float("inf")) or not self.try_start(job, now):
                failed[key] = min(wall, failed.get(key, float("inf")))
                waiting.append(job)
        self.pending = waiting

    def inside(self, now: float) -> bool:
        return self.occ is not None and self.occ[0] <= now < self.occ[1]

    def try_start(self, job: Booked, now: float) -> bool:
        if job.reservation:
            if not self.inside(now):
                return False  # WaitingForReservation
            avoid = frozenset(self.nodes) - self.held  # its held nodes first
        else:
            avoid = self.held
        out = self.engine.allocate(job.group(avoid), raise_errors=False)
        if not out.allocated and avoid:  # as the round does: nowhere but on the nodes it avoids, maybe
            out = self.engine.allocate(job.group(), raise_errors=False)
        if not out.allocated:
            return False
        node = out.node or ""
        if not job.reservation and (CLUSTER, node) in self.held:
            assert self.occ is not None
            start, end, _ = self.occ
            if not windows.may_use_held([job.walltime], now, MARGIN, start, end, self.shape.lend_idle,
                                        self.own_waiting):
                self.engine.release(out.devices)  # HeldForReservation
                return False
        job.started, job.node, job.devices = now, node, list(out.devices)
        self.used_gpus += job.count
        heapq.heappush(self.running, (now + job.runs, job.id, job))
        if job.reservation and self.days:
            day = self.days[-1]
            day["own"] += job.count
            if day["own"] >= self.shape.reserved:
                day["last_start"] = now - self.occ[0] if self.occ else None
        return True

    # ----------------------------------------------------------------------------------------- the figures
    def figures(self) -> dict:
        s = self.shape
        window_hours = sum(end - start for start, end, _ in self.occs) / 3600
        reserved = s.reserved * window_hours
        own = self.gpu_seconds["own"] / 3600
        for day in self.days:
            late = day["last_start"]
            day["late"] = None if late is None else late + TICK + LATENCY
        return {"days": self.days, "reserved_gpu_hours": reserved, "own_gpu_hours": own,
                "idle_gpu_hours": reserved - own, "lent_inside_gpu_hours": self.gpu_seconds["lent_inside"] / 3600,
                "lent_before_gpu_hours": self.gpu_seconds["lent_before"] / 3600,
                "busy": self.gpu_seconds["busy"] / (self.seconds * s.nodes * GPUS), "claims": len(self.incoming)}
