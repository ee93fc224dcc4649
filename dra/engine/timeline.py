"""Planned starts: when and where each of a list of waiting groups would start, given when running claims end.

Slurm's conservative backfill plan, on this engine. ``plan_starts(engine, endings, waiting, now)`` takes the
engine with every running device in use, the running claims' ends (``Ending``: a time and the devices it
frees; a running claim with no end is simply not listed, and its devices stay in use for ever), and the
waiting groups in the scheduler's order, each with its duration (None: it never ends). For each group in
turn, it tries the candidate times -- now, then each distinct end of a running claim or of a group planned
before it, earliest first -- and at each one asks the engine to place the group on what is free then: the
devices of the claims ended by then, minus what the groups planned before it hold over the whole of its stay
(from that time to its end). The first time it fits is its planned start. So a group never takes what an
earlier one was promised, and a later group may start before an earlier one where it fits in a gap (that is
backfill, planned).

The engine is handed back as it was given: every release and placement made here is undone before return
(if the engine raises half-way, its state is in doubt and the caller must rebuild it). Cost: at most
``max_candidates`` placements per group (past that many distinct ends, every k-th one is tried: a start may
come out later than it could be, never earlier), each an ordinary ``Engine.allocate``.
"""
from __future__ import annotations

import bisect
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cel import CostBudgetExhausted, CostMeter, metered
from .types import AllocatedDevice, ClaimGroup

MAX_CANDIDATES = 64


@dataclass(frozen=True)
class Ending:
    at: float  # when the devices are free again (seconds, any epoch the caller uses throughout)
    devices: tuple[AllocatedDevice, ...]


@dataclass(frozen=True)
class Waiting:
    group: ClaimGroup
    seconds: float | None  # how long it holds its devices once started (None: for ever)


@dataclass
class Planned:
    key: str
    start: float
    end: float | None
    cluster: str | None
    node: str | None
    devices: list[AllocatedDevice] = field(default_factory=list)


class _State:
    """What the engine is made to see on top of what it was given. A device may be busy for two reasons at
    once (a running claim that has not ended yet, and a planned group that will take it after), and the
    engine counts an exclusive device busy or not, so the reasons are counted here: the engine hears of a
    device only when its count moves between 0 and 1."""

    def __init__(self, engine, ends: list[Ending]) -> None:
        self.engine, self.ends = engine, ends
        self.ended = 0  # ends[:ended] are applied
        self.holding: set[int] = set()  # planned groups (by index) whose devices are applied
        self.count: dict[AllocatedDevice, int] = {d: 1 for e in ends for d in e.devices}
        self.given = dict(self.count)

    def change(self, devices, sign: int) -> None:
        for d in devices:
            before = self.count.get(d, 0)
            self.count[d] = before + sign
            if before == 0 and sign > 0:
                self.engine.commit([d])
            elif before == 1 and sign < 0:
                self.engine.release([d])

    def move(self, plan: list[Planned], start: float, end: float | None) -> None:
        """To what is busy over [start, end): the running claims not ended by ``start``, and the planned
        groups holding their devices at some moment of it."""
        target = bisect.bisect_right(self.ends, start, key=lambda e: e.at)
        while self.ended < target:
            self.change(self.ends[self.ended].devices, -1)
            self.ended += 1
        while self.ended > target:
            self.ended -= 1
            self.change(self.ends[self.ended].devices, +1)
        holding = {i for i, p in enumerate(plan) if _overlaps(p, start, end)}
        for i in self.holding - holding:
            self.change(plan[i].devices, -1)
        for i in holding - self.holding:
            self.change(plan[i].devices, +1)
        self.holding = holding

    def restore(self) -> None:
        for d, n in self.count.items():
            was = self.given.get(d, 0)
            if n > 0 and was == 0:
                self.engine.release([d])
            elif n == 0 and was > 0:
                self.engine.commit([d])


def plan_starts(engine, endings: Sequence[Ending], waiting: Sequence[Waiting], now: float,
                max_candidates: int = MAX_CANDIDATES, budget: int | None = None) -> list[Planned | None]:
    """One ``Planned`` per waiting group, in order (None: no start found among the candidate times, or its
    search spent ``budget`` CEL cost units: every candidate time of one group shares one budget, so a claim
    whose selectors are expensive costs the plan no more than it costs a round)."""
    ends = sorted(endings, key=lambda e: e.at)
    ats = [e.at for e in ends]
    plan: list[Planned] = []
    out: list[Planned | None] = []
    state = _State(engine, ends)
    try:
        for item in waiting:
            times = _candidates(now, ats + [p.end for p in plan if p.end is not None], max_candidates)
            try:
                with metered(CostMeter(budget)) if budget is not None else contextlib.nullcontext():
                    found = _earliest(engine, state, plan, item, times)
            except CostBudgetExhausted:  # the engine's in-use state is untouched by a stopped search
                found = None
            if found is not None:
                plan.append(found)
            out.append(found)
    finally:
        state.restore()
    return out


def _earliest(engine, state: _State, plan: list[Planned], item: Waiting, times: list[float]) -> Planned | None:
    # Planned groups' ends free devices too: a group may start when one before it is done.
    for t in times:
        state.move(plan, t, None if item.seconds is None else t + item.seconds)
        outcome = engine.allocate(item.group, raise_errors=False, explain=False)  # only whether it fits
        if outcome.allocated:
            engine.release(outcome.devices)
            return Planned(item.group.key, t, None if item.seconds is None else t + item.seconds,
                           outcome.cluster, outcome.node, list(outcome.devices))
    return None


def may_backfill(walltimes: Sequence[float | None], now: float, margin: float, protected: Sequence[float]) -> bool:
    """Conservative backfill's rule (Slurm's): a group may take devices that planned claims need only when every
    claim of it has a walltime and its end (``now`` + its longest walltime) + ``margin`` (the lease sweep's period
    and a round's latency: when the devices are in fact free again) is no later than each of those claims'
    planned starts (``protected``). A claim without a walltime might never end: it never backfills."""
    if not walltimes or any(not w for w in walltimes):
        return False
    end = now + max(w for w in walltimes if w) + margin
    return all(end <= start for start in protected)


def _candidates(now: float, ats: list[float], limit: int) -> list[float]:
    later = sorted({max(at, now) for at in ats} - {now})
    if len(later) >= limit:
        step = -(-len(later) // (limit - 1))
        picked = later[step - 1::step]
        if picked[-1] != later[-1]:
            picked.append(later[-1])
        later = picked
    return [now, *later]


def _overlaps(p: Planned, start: float, end: float | None) -> bool:
    """Does planned ``p`` hold its devices at some moment of [start, end)?"""
    return (end is None or p.start < end) and (p.end is None or p.end > start)
