"""Reservations in the claims round: who may use held capacity, and admission through a reservation.

A reservation (``queues.reservation_spec``) holds nodes for an occurrence of its window from ``start −
leadTimeSeconds`` to ``end`` (chosen by ``scheduler.services.reservation_tick``, kept in ``Reservation.held``).
The round's screen (``ReservationScreen``, outermost: before the defragmentation and queue-head holds):

- a claim labelled ``draservice.io/reservation: <name>`` waits (``WaitingForReservation``) outside the window;
  inside it, the engine tries the held nodes first, and a placement, while the reservation's devices in use stay
  within what it reserves, is marked ``reservation`` and admitted by ``admit`` below: charged to no queue (the
  reservation is its quota), recorded in the ledger with the reservation's name. Beyond what it reserves, the
  claim is an ordinary one of its queue;
- any other placement on a held node is undone (``HeldForReservation``) unless every claim of it has a walltime
  (``draservice.io/lease-ttl``) that ends, with the lease sweep's period and a round's latency
  (``scheduler.services.plan.margin``), before the start -- or, inside the window of a reservation with
  ``lendIdle``, before its end while none of the reservation's own claims waits for room in it
  (``dra.windows.may_use_held``). A claim without a walltime may run for ever: it never lands there.

Holds are whole nodes: a node that serves a reservation serves nothing else that would run into the window.
"""
from __future__ import annotations

import dataclasses
import zlib
from datetime import datetime, timedelta

from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import queueing
from dra import windows
from draservice.prepared import Prepared
from queues import queues_sql
from queues import reservation_spec as spec_mod
from queues.models import QuotaCharge, Reservation
from queues.services import reservations as reservation_services
from queues.services.resolve import Tree, queue_of
from scheduler.services import plan
from scheduler.services.holds import Screen

HELD_FOR_RESERVATION = "held_for_reservation"  # engine outcome reasons (the round maps them to Reasons)
WAITING_FOR_RESERVATION = "waiting_for_reservation"
ISO = "%Y-%m-%dT%H:%M:%SZ"


@dataclasses.dataclass
class Booking:
    name: str
    spec: dict
    occ: windows.Occurrence  # running now, or the next
    nodes: frozenset[tuple[str, str]]  # held for ``occ`` (empty until the tick chose them)
    reserved: int

    @property
    def hold_from(self) -> datetime:
        return self.occ.start - timedelta(seconds=self.spec.get("leadTimeSeconds") or 0)

    def holding(self, now: datetime) -> bool:
        return self.hold_from <= now < self.occ.end

    def inside(self, now: datetime) -> bool:
        return self.occ.start <= now < self.occ.end


# Read by every claims round: compiled once (compiling the queryset cost more than running it).
_BOOKED = Prepared(lambda: Reservation.objects.only("name", "spec", "held"), ())


def bookings(now: datetime) -> dict[str, Booking]:
    """Every reservation with an occurrence left: its current or next one, and the nodes held for it."""
    out = {}
    for r in _BOOKED.rows():
        occ = windows.current_or_next(spec_mod.parsed_window(r.spec), now)
        if occ is None:
            continue
        held = r.held if r.held.get("start") == occ.start.strftime(ISO) else {}
        out[r.name] = Booking(r.name, r.spec, occ, frozenset(tuple(n) for n in held.get("nodes") or []),
                              reservation_services.reserved_devices(r.spec))
    return out


def label_of(group) -> str | None:
    """The reservation a group's claims name (a consumer's claims: the first that names one)."""
    return next((n for c in group.claims if (n := (c.labels or {}).get(spec_mod.LABEL))), None)


def devices_of(outcome) -> int:
    return sum(1 for d in outcome.devices if not d.share_id and not d.admin_access)


class ReservationScreen(Screen):
    def __init__(self, engine, inner: Screen, books: dict[str, Booking], now: datetime) -> None:
        self.engine, self.inner, self.books, self.now = engine, inner, books, now
        self.holding = [b for b in books.values() if b.holding(now) and b.nodes]
        self.used: dict[str, int] | None = None  # devices in use per reservation, read once one is placed
        self.waiting: set[str] | None = None  # reservations whose own claims wait for room, read once needed

    def avoid(self, group) -> frozenset[tuple[str, str]]:
        name = label_of(group)
        mine = self.books.get(name) if name else None
        if mine is not None and mine.inside(self.now) and mine.nodes:
            # Its own held nodes first: every other node is "avoided" (tried after them).
            return frozenset((m.name, n) for m in self.engine.clusters.values() for n in m.node_order) - mine.nodes
        return self.inner.avoid(group) | frozenset(w for b in self.holding for w in b.nodes)

    def __call__(self, group, outcome):
        name = label_of(group)
        if name is not None:
            return self._booked(group, outcome, name)
        return self._others(group, outcome, None) or self.inner(group, outcome)

    def _booked(self, group, outcome, name: str):
        b = self.books.get(name)
        if outcome.error is not None:
            return outcome
        if b is None or not b.inside(self.now):
            if outcome.allocated:
                self.engine.release(outcome.devices)
            when = (f"its next window starts at {b.occ.start.strftime(ISO)}" if b is not None
                    else "it has no window left")
            return dataclasses.replace(outcome, allocated=False, claims=[], devices=[],
                                       reason=WAITING_FOR_RESERVATION, diagnostics={"reservation": name},
                                       message=f'waiting for reservation "{name}": {when}')
        if not outcome.allocated:
            return outcome
        if self.used is None:
            self.used = reservation_services.in_use(list(self.books))
        n = devices_of(outcome)
        if self.used.get(name, 0) + n > b.reserved:  # beyond what it reserves: an ordinary claim of its queue
            return self._others(group, outcome, b) or self.inner(group, outcome)
        self.used[name] = self.used.get(name, 0) + n
        return dataclasses.replace(outcome, diagnostics={**(outcome.diagnostics or {}), "reservation": name})

    def _others(self, group, outcome, mine: Booking | None):
        """The outcome undone when it lands on another reservation's held node and may not; else None."""
        if not outcome.allocated or not outcome.node:
            return None
        where = (outcome.cluster or "", outcome.node)
        for b in self.holding:
            if b is mine or where not in b.nodes or self._may_borrow(group, b):
                continue
            self.engine.release(outcome.devices)
            return dataclasses.replace(
                outcome, allocated=False, claims=[], devices=[], reason=HELD_FOR_RESERVATION,
                message=f"node {where[0]}/{where[1]} is held for reservation {b.name!r} from "
                        f"{b.hold_from.strftime(ISO)} to {b.occ.end.strftime(ISO)}; a claim there must end before "
                        + ("its end (it lends idle capacity)" if b.spec.get("lendIdle") and b.inside(self.now)
                           else "its start") + " (draservice.io/lease-ttl)",
                diagnostics={"heldFor": b.name, "node": where[1], "cluster": where[0]})
        return None

    def _may_borrow(self, group, b: Booking) -> bool:
        lend = bool(b.spec.get("lendIdle"))
        return windows.may_use_held([c.lease_seconds for c in group.claims], self.now.timestamp(),
                                    plan.margin().total_seconds(), b.occ.start.timestamp(), b.occ.end.timestamp(),
                                    lend, lend and b.inside(self.now) and b.name in self._own_waiting())

    def _own_waiting(self) -> set[str]:
        """Reservations with a pending claim labelled for them while they hold less than they reserve: their
        idle capacity is not lent (it is their claims')."""
        if self.waiting is None:
            labels = ResourceClaim.objects.filter(phase=Phase.PENDING, labels__has_key=spec_mod.LABEL) \
                .values_list("labels", flat=True)
            named: set[str] = {str((x or {}).get(spec_mod.LABEL)) for x in labels} & set(self.books)
            used = reservation_services.in_use(sorted(named)) if named else {}
            self.waiting = {n for n in named if used.get(n, 0) < self.books[n].reserved}
        return self.waiting


def round_screen(engine, inner: Screen) -> Screen:
    now = timezone.now()
    books = bookings(now)
    if not books:
        return inner
    return ReservationScreen(engine, inner, books, now)


def admit(units: dict, view) -> dict[int, queueing.Verdict]:
    """Unit index -> its verdict, for the units placed through a reservation (every placement marked with one
    name) that it still has room for, counted under a lock per reservation: admitted, charged to no queue. The
    others are left to the queues' admission."""
    wanted: dict[int, str] = {}
    for i, unit in units.items():
        marks = {(p.diagnostics or {}).get("reservation") for p in unit.placements}
        if len(marks) == 1 and None not in marks:
            wanted[i] = str(next(iter(marks)))
    if not wanted:
        return {}
    names = sorted(set(wanted.values()))
    for name in names:  # in name order: two commits never wait for each other crosswise
        queues_sql.lock_until_commit(zlib.crc32(f"reservation:{name}".encode()))
    reserved = {r.name: reservation_services.reserved_devices(r.spec)
                for r in Reservation.objects.filter(name__in=names)}
    used = reservation_services.in_use(names)
    tree = Tree.load()
    out: dict[int, queueing.Verdict] = {}
    for i, name in sorted(wanted.items()):
        claims = [c for p in units[i].placements for c in p.claims]
        n = sum(1 for p in units[i].placements for a in p.allocations
                for res in ((a or {}).get("devices") or {}).get("results") or []
                if not res.get("shareID") and not res.get("adminAccess"))
        if name not in reserved or used.get(name, 0) + n > reserved[name]:
            continue
        used[name] = used.get(name, 0) + n
        queue = queue_of(claims[0], claims[0].namespace.name, tree)
        out[i] = queueing.Verdict(queueing.ADMITTED, f'admitted through reservation "{name}" (not charged to '
                                                     f'queue "{queue}")', queue, name)
    # A claim readmitted after a preemption leaves its old charges: they would count it against its queue.
    QuotaCharge.objects.filter(claim_id__in=[c.id for i in out for p in units[i].placements
                                             for c in p.claims]).delete()
    return out
