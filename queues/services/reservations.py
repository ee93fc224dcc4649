"""Creating, replacing, patching and deleting reservations: one writer, one lock, nothing half-stored.

Every write takes one transaction-scoped advisory lock (``WRITE_LOCK``), so the checks against the other
reservations run on a stable set:
- conflicts: every occurrence over the next ``HORIZON`` (90 days), from its start minus its lead time to its
  end, is compared with the others'; for each distinct set of reservations that overlap, the engine places
  all of them at once on the current inventory with nothing in use (``reservation_fit``); if they do not fit,
  409 naming the other reservation and the first conflicting occurrence;
- guarantees: at no instant may the reserved devices of a class exceed the fleet's devices of it minus the sum
  of the queues' nominal quotas for it (409 naming those queues), so that a reservation never weakens a queue's
  nominal guarantee.
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Sum
from django.utils import timezone

from claims.models import DeviceAllocation, Phase
from claims.services import fleet
from claims.services.taking import bump_fleet_version
from dra import windows
from dra.engine import Engine
from draservice import audit
from draservice.errors import AlreadyExists, Conflict, Forbidden, Invalid
from draservice.etag import check_if_match
from draservice.requests import merge_patch
from queues import queues_sql
from queues import reservation_spec as spec_mod
from queues.models import API_VERSION, QuotaCharge, Reservation
from queues.services import reservation_fit as fit
from queues.services.resolve import Tree, queue_of

WRITE_LOCK = zlib.crc32(b"draservice.reservations.write")
HORIZON = timedelta(days=90)
ISO = "%Y-%m-%dT%H:%M:%SZ"


def _lock() -> None:
    queues_sql.lock_until_commit(WRITE_LOCK)


# ------------------------------------------------------------------------------------------------ reading

def rendered(r: Reservation, now: datetime | None = None, used: dict[str, int] | None = None) -> dict:
    return {"apiVersion": API_VERSION, "kind": spec_mod.KIND,
            "metadata": {"name": r.name, "uid": str(r.uid), "resourceVersion": str(r.resource_version),
                         "labels": r.labels, "annotations": r.annotations,
                         "creationTimestamp": r.created_at.strftime(ISO)},
            "spec": r.spec, "status": status(r, now or timezone.now(), used)}


def rendered_many(items: list[Reservation]) -> list[dict]:
    now = timezone.now()
    used = in_use([r.name for r in items])
    return [rendered(r, now, used) for r in items]


def reserved_devices(spec: dict) -> int:
    return sum(int(r.get("devices") or 0) for r in spec.get("resources") or [])


def status(r: Reservation, now: datetime, used: dict[str, int] | None = None) -> dict:
    window = spec_mod.parsed_window(r.spec)
    occ = windows.current_or_next(window, now)
    inside = occ is not None and occ.start <= now < occ.end
    reserved = reserved_devices(r.spec)
    running = (used if used is not None else in_use([r.name])).get(r.name, 0) if inside else 0
    ready = {"type": "Ready", "status": "True", "reason": "Accepted",
             "message": "fits the fleet beside the other reservations and the queues' nominal quotas",
             "lastTransitionTime": r.created_at.strftime(ISO)}
    degraded = {"type": "Degraded", "status": "True" if r.degraded else "False",
                "reason": "Shortfall" if r.degraded else "AsBooked", "message": r.degraded or "",
                "lastTransitionTime": r.updated_at.strftime(ISO)}
    unplaced = [f"spec.resources[{i}]" for i, res in enumerate(r.spec.get("resources") or []) if not res.get("devices")]
    if unplaced:
        degraded["message"] = (degraded["message"] + "; " if r.degraded else "") + (
            ", ".join(unplaced) + ": counters and capacity are booked but not held (only devices are)")
    out: dict = {"conditions": [ready, degraded],
                 "held": {"devices": reserved, **({k: r.held[k] for k in ("start", "end", "nodes") if k in r.held}
                                                  if _holding(r, now) else {})},
                 "utilisation": {"devicesInUse": running, "devicesReserved": reserved,
                                 "fraction": round(running / reserved, 4) if reserved and inside else 0.0}}
    if occ is not None:
        out["nextWindow"] = {"start": occ.start.strftime(ISO), "end": occ.end.strftime(ISO)}
    return out


def _holding(r: Reservation, now: datetime) -> bool:
    end = r.held.get("end")
    return bool(end) and datetime.fromisoformat(end.replace("Z", "+00:00")) > now


def in_use(names: list[str]) -> dict[str, int]:
    """Reservation name -> devices its claims hold now (claims admitted through it: labelled, not charged to
    their queue)."""
    if not names:
        return {}
    charged = QuotaCharge.objects.filter(claim_id=OuterRef("claim_id"))
    rows = (DeviceAllocation.objects.filter(claim__phase=Phase.ALLOCATED, share_id="", admin_access=False,
                                            claim__labels__has_key=spec_mod.LABEL)
            .exclude(Exists(charged)).values_list("claim__labels", flat=True))
    out: dict[str, int] = defaultdict(int)
    wanted = set(names)
    for labels in rows:
        name = (labels or {}).get(spec_mod.LABEL)
        if name in wanted:
            out[name] += 1
    return out


@dataclass(frozen=True)
class Withheld:
    """A reservation inside its held span [start − lead, end) now: what it takes from what queues may borrow."""

    name: str
    devices: dict[str, int]  # device class -> devices it reserves
    nodes: frozenset[tuple[str, str]]  # (cluster, node) held for the occurrence (empty until the pass chose them)
    lent: dict[str, int]  # device class -> queues' charged devices running on those nodes now (lent to them)

    def amount(self, cls: str, lending: int = 0) -> int:
        """Devices of ``cls`` withheld from the queues: what it reserves, less what it lends them now (those
        are in their usage already) and ``lending`` more (a unit being admitted onto its nodes)."""
        return max(0, self.devices.get(cls, 0) - self.lent.get(cls, 0) - lending)


def withholding(now: datetime) -> list[Withheld]:
    """The reservations holding capacity now (``queues.services.admission``: what a cohort may lend excludes
    it, so borrowing never counts on capacity a reservation is about to use or uses)."""
    out: list[tuple[str, dict[str, int], frozenset]] = []
    for r in Reservation.objects.only("name", "spec", "held"):
        occ = windows.current_or_next(spec_mod.parsed_window(r.spec), now)
        if occ is None or not held_span(r.spec, occ).start <= now < occ.end:
            continue
        devices: dict[str, int] = defaultdict(int)
        for res in r.spec.get("resources") or []:
            if res.get("devices"):
                devices[res["deviceClassName"]] += int(res["devices"])
        held = r.held if r.held.get("start") == occ.start.strftime(ISO) else {}
        out.append((r.name, dict(devices), frozenset(tuple(n) for n in held.get("nodes") or [])))
    nodes = {n for _, _, held_nodes in out for _, n in held_nodes}
    on_node: dict[tuple[str, str, str], int] = defaultdict(int)
    if nodes:
        rows = (QuotaCharge.objects.filter(unit="devices", claim__phase=Phase.ALLOCATED, claim__node__in=nodes)
                .values_list("claim__cluster", "claim__node", "device_class").annotate(total=Sum("amount")))
        for cluster, node, cls, total in rows:
            on_node[(cluster, node, cls)] += int(total)
    return [Withheld(name, devices, held_nodes,
                     {cls: sum(on_node.get((c, n, cls), 0) for c, n in held_nodes) for cls in devices})
            for name, devices, held_nodes in out]


def visible(access, items):
    """The reservations ``access`` may use (a namespace token: those whose users list one of its namespaces or
    their queues); everyone else reads all."""
    if access.kind != "namespace":
        return items
    tree = Tree.load()
    queues = {tree.by_namespace.get(ns, "default") for ns in access.namespaces}
    return [r for r in items if set(r.spec["users"]["namespaces"]) & set(access.namespaces)
            or set(r.spec["users"]["queues"]) & queues]


# ------------------------------------------------------------------------------------------------ claims

def check_claims(namespace: str, claims: list) -> None:
    """A claim naming a reservation (``draservice.io/reservation``) whose users do not include its namespace or
    its queue: 403, naming the label."""
    named = [(path, c, (getattr(c, "labels", None) or {}).get(spec_mod.LABEL)) for path, c in claims]
    named = [n for n in named if n[2] is not None]
    if not named:
        return
    found = {r.name: r for r in Reservation.objects.filter(name__in={n for *_, n in named})}
    tree = Tree.load()
    errors = []
    for path, claim, name in named:
        field = f"{path + '.' if path else ''}metadata.labels[{spec_mod.LABEL}]"
        r = found.get(str(name))
        if r is None:
            errors.append((field, f'Forbidden: reservation "{name}" does not exist'))
            continue
        users = r.spec["users"]
        if namespace not in users["namespaces"] and queue_of(claim, namespace, tree) not in users["queues"]:
            errors.append((field, f'Forbidden: namespace "{namespace}" may not use reservation "{name}" (not in '
                                  "its spec.users)"))
    if errors:
        raise Forbidden(errors)


# ------------------------------------------------------------------------------------------------ writing

def create(body) -> Reservation:
    obj = _valid(body, None)
    with transaction.atomic():
        _lock()
        if Reservation.objects.filter(name=obj["metadata"]["name"]).exists():
            raise AlreadyExists([("metadata.name", f'reservations "{obj["metadata"]["name"]}" already exists')])
        return _store(Reservation(name=obj["metadata"]["name"]), obj, creating=True)


def replace(name: str, body, if_match: list[str] | None) -> tuple[Reservation, bool]:
    obj = _valid(body, name)
    with transaction.atomic():
        _lock()
        r = Reservation.objects.select_for_update().filter(name=name).first()
        if r is None:
            if if_match is not None:
                check_if_match(if_match, 0)
            return _store(Reservation(name=name), obj, creating=True), True
        check_if_match(if_match, r.resource_version)
        return _store(r, obj, creating=False), False


def patch(name: str, change, if_match: list[str] | None) -> Reservation:
    if not isinstance(change, dict):
        raise Invalid([("", "a merge patch must be an object")])
    with transaction.atomic():
        _lock()
        r = Reservation.objects.select_for_update().get(name=name)
        check_if_match(if_match, r.resource_version)
        current = {"apiVersion": API_VERSION, "kind": spec_mod.KIND,
                   "metadata": {"name": r.name, "labels": r.labels, "annotations": r.annotations}, "spec": r.spec}
        return _store(r, _valid(merge_patch(current, change), name), creating=False)


def delete(name: str, if_match: list[str] | None) -> None:
    with transaction.atomic():
        _lock()
        r = Reservation.objects.select_for_update().get(name=name)
        check_if_match(if_match, r.resource_version)
        audit.record(spec_mod.KIND, name, audit.DELETE, _audited(r), None)
        r.delete()
        bump_fleet_version()  # claims held off its nodes or waiting for the quota it withheld are tried again


def _audited(r: Reservation) -> dict:
    return {"metadata": {"labels": r.labels, "annotations": r.annotations}, "spec": r.spec}


def _valid(body, url_name: str | None) -> dict:
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict) and url_name \
            and not body["metadata"].get("name"):
        body = {**body, "metadata": {**body["metadata"], "name": url_name}}
    obj, errors = spec_mod.normalize(body, url_name)
    if errors:
        raise Invalid(errors)
    return obj


def _store(r: Reservation, obj: dict, creating: bool) -> Reservation:
    spec = obj["spec"]
    if not creating and spec == r.spec and obj["metadata"]["labels"] == r.labels \
            and obj["metadata"]["annotations"] == r.annotations:
        return r
    if creating or spec != r.spec:
        check_fleet(r.name, spec, list(Reservation.objects.exclude(name=r.name)), timezone.now())
    before = None if creating else _audited(r)
    if not creating and spec != r.spec:
        r.held, r.degraded = {}, ""  # held again from the new spec by the scheduler's next pass
        bump_fleet_version()  # what it held or withheld may be free now
    r.spec = spec
    r.labels, r.annotations = obj["metadata"]["labels"], obj["metadata"]["annotations"]
    if not creating:
        r.resource_version += 1
    r.save()
    audit.record(spec_mod.KIND, r.name, audit.CREATE if creating else audit.UPDATE, before, _audited(r))
    return r


# ------------------------------------------------------------------------------------------------ the checks

def held_span(r_spec: dict, occ: windows.Occurrence) -> windows.Occurrence:
    """An occurrence from its start minus the lead time (when its capacity starts being held) to its end."""
    return windows.Occurrence(occ.start - timedelta(seconds=r_spec.get("leadTimeSeconds") or 0), occ.end)


def _spans(spec: dict, now: datetime) -> list[windows.Occurrence]:
    window = spec_mod.parsed_window(spec)
    return [held_span(spec, o) for o in windows.occurrences(window, now, now + HORIZON)]


def _unheld(spec: dict, span: windows.Occurrence) -> windows.Occurrence:
    """The occurrence of a held span (its start is the span's plus the lead time)."""
    return windows.Occurrence(span.start + timedelta(seconds=spec.get("leadTimeSeconds") or 0), span.end)


def check_fleet(name: str, spec: dict, others: list[Reservation], now: datetime) -> None:
    """409 when ``spec`` does not fit the fleet beside the reservations it overlaps, or would take from the
    queues' nominal quotas (see the module docstring)."""
    mine = _spans(spec, now)
    theirs = {o.name: (o, _spans(o.spec, now)) for o in others}
    view = fleet.current_view()
    alone = fit.place(Engine(view.snapshot, []), view.cluster_labels, name, spec)
    if not alone.whole:
        raise Conflict(f'Reservation "{name}" does not fit the fleet\'s inventory: ' + "; ".join(alone.short))
    checked: set[tuple[str, ...]] = {()}
    overlap_sets: list[tuple[str, ...]] = []
    for occ in mine:
        together = tuple(sorted(n for n, (_, spans) in theirs.items() if any(s.overlaps(occ) for s in spans)))
        if together in checked:
            continue
        checked.add(together)
        overlap_sets.append(together)
        engine = Engine(view.snapshot, [])
        for other in together:
            fit.place(engine, view.cluster_labels, other, theirs[other][0].spec)
        placed = fit.place(engine, view.cluster_labels, name, spec)
        if placed.whole:
            continue
        other, first = _first_conflict(occ, together, theirs)
        theirs_occ = _unheld(theirs[other][0].spec, first)
        raise Conflict(f'Reservation "{name}" conflicts with reservation "{other}": its occurrence '
                       f"{_span_words(_unheld(spec, occ))} and {other}'s {_span_words(theirs_occ)} overlap (lead "
                       f"times included) and the fleet cannot hold both ({'; '.join(placed.short)})")
    _check_nominal(name, spec, theirs, overlap_sets or [()], view)


def shortfall(r: Reservation, older: list[Reservation], view, now: datetime) -> str:
    """What of ``r`` the fleet's current inventory cannot hold, beside the older reservations its occurrences
    over the next ``HORIZON`` overlap ('' when all of it fits): the first shortfall, with its occurrence. The
    reservations' pass asks after an inventory change (``Degraded``); the older one keeps its capacity."""
    theirs = {o.name: (o, _spans(o.spec, now)) for o in older}
    checked: set[tuple[str, ...]] = set()
    for occ in _spans(r.spec, now):
        together = tuple(sorted(n for n, (_, spans) in theirs.items() if any(s.overlaps(occ) for s in spans)))
        if together in checked:
            continue
        checked.add(together)
        engine = Engine(view.snapshot, [])
        for other in together:
            fit.place(engine, view.cluster_labels, other, theirs[other][0].spec)
        placed = fit.place(engine, view.cluster_labels, r.name, r.spec)
        if not placed.whole:
            beside = f" beside reservations {', '.join(together)}" if together else ""
            return (f"the fleet's inventory holds too little for its occurrence {_span_words(_unheld(r.spec, occ))}"
                    f"{beside}: " + "; ".join(placed.short))
    return ""


def _first_conflict(occ, together, theirs) -> tuple[str, windows.Occurrence]:
    found = [(s, n) for n in together for s in theirs[n][1] if s.overlaps(occ)]
    span, other = min(found, key=lambda x: (x[0].start, x[1]))
    return other, span


def _span_words(occ: windows.Occurrence) -> str:
    return f"{occ.start.strftime(ISO)}..{occ.end.strftime(ISO)}"


def _check_nominal(name: str, spec: dict, theirs: dict, overlap_sets: list[tuple[str, ...]], view) -> None:
    """At any instant, reserved devices of a class <= the fleet's devices of it - the queues' nominal."""
    tree = Tree.load()
    nominal, holders = nominal_devices(tree)
    wanted: dict[str, int] = defaultdict(int)
    for r in spec.get("resources") or []:
        if r.get("devices"):
            wanted[r["deviceClassName"]] += int(r["devices"])
    if not wanted:
        return
    engine = Engine(view.snapshot, [])
    for cls in wanted:
        total = fleet_devices(engine, cls)
        for together in overlap_sets:
            booked = wanted[cls] + sum(int(r.get("devices") or 0) for n in together
                                       for r in theirs[n][0].spec.get("resources") or []
                                       if r.get("deviceClassName") == cls)
            if booked > total - nominal.get(cls, 0):
                queues = ", ".join(f'"{q}"' for q in sorted(holders.get(cls, ()))) or "none"
                raise Conflict(f'Reservation "{name}" would weaken the queues\' nominal quotas: {booked} {cls} '
                               f"devices reserved at once, the fleet has {total} of which {nominal.get(cls, 0)} "
                               f"are the nominal quota of queues {queues}")


def nominal_devices(tree: Tree) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Class -> the sum of the queues' nominal device quotas (a queue under an ancestor that has an entry for
    the class is inside that ancestor's), and class -> the queues counted."""
    total: dict[str, int] = defaultdict(int)
    holders: dict[str, set[str]] = defaultdict(set)
    for q in tree.queues.values():
        for entry in q.spec.get("quotas") or []:
            cls = entry.get("deviceClassName")
            n = int(((entry.get("devices") or {}).get("nominal")) or 0)
            if not n or any(_has_entry(a, cls) for a in tree.chain(q.name)[1:]):
                continue
            total[cls] += n
            holders[cls].add(q.name)
    return total, holders


def _has_entry(queue, cls: str) -> bool:
    return any(e.get("deviceClassName") == cls for e in queue.spec.get("quotas") or [])


def fleet_devices(engine, cls: str) -> int:
    """Devices of ``cls`` in the fleet (free on an engine with nothing in use)."""
    return sum(fit.free_on(engine, model, node, cls) for model in engine.clusters.values() for node in model.node_order)
