"""Admission: does a placed unit (a claim, a consumer's claims, a gang) fit its queue's quota?

Called by the scheduler's commit step (``scheduler.services.admit``) in the commit's transaction, after the
claims app's race checks, with what the engine actually placed. Under locks held to commit:

1. the queue rows of every unit's queue and its ancestors, ``SELECT ... FOR SHARE`` in ascending id (the
   fixed order that rules out deadlocks; a queue update waits for them, so a commit sees one version); then
2. one advisory lock for the root (``ROOT_LOCK``): borrowing reads every queue's usage, so admissions that
   read usage must not interleave with any that charges (each is short: no engine, no CEL): exclusive where a
   queue of the chains has quotas, shared otherwise (``_lock``);
3. usage is read (charges of Allocated claims; only once a quota entry needs it), each unit checked in order
   (earlier admitted units of the same commit count for the later ones) and the admitted units' charges
   inserted.

A unit that does not fit holds nothing: its devices are not written and nothing is charged.

The rule, for every (deviceClassName, unit, resource) the placement uses, at the leaf and every ancestor that
has a quota entry for the class (and whose ``clusterSelector`` covers the cluster):
``use after <= nominal + borrowingLimit`` (absent borrowingLimit: unlimited). At every level, a queue going
beyond its nominal borrows: what its siblings keep for themselves (``nominal - lendingLimit``, where idle) must
stay free, so ``sum over the siblings of max(use, kept) + use after <= room``, the room being the parent's
nominal + borrowingLimit, or, at the top level (or under a parent without borrowingLimit), the fleet's
devices of the class, which the engine counts, less what reservations hold: from a reservation's start minus
its lead time to its end, the devices it reserves are not the cohort's to lend (``reservations.withholding``:
less those it lends the queues' claims on its held nodes, which their usage counts already). A class the leaf
does not list is refused (``NoQuotaForClass``), except in ``default`` (nominal 0 and unlimited borrowing for
every class).
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from fractions import Fraction
from typing import NamedTuple

from django.db import connection
from django.utils import timezone

from claims.placement import clusters_matching
from claims.services import locking, queueing
from claims.services.engines import engines
from dra.engine.selectors import MATCH
from draservice.bulk import bulk_insert
from queues import queues_sql
from queues import spec as queue_spec
from queues.models import DEFAULT_QUEUE, Queue, QuotaCharge
from queues.quantities import quantity
from queues.services import owed as debts
from queues.services import reservations
from queues.services import usage as u
from queues.services.resolve import Tree, queue_of

ROOT_LOCK = zlib.crc32(b"draservice.queues.root")
CHARGE_COLUMNS = [f.attname for f in QuotaCharge._meta.concrete_fields if not f.primary_key]
_capacity_cache: dict = {"key": None, "classes": {}}


def admit(units: list, view, now) -> dict[int, queueing.Verdict]:
    tree = Tree.load()
    verdicts: dict[int, queueing.Verdict] = {}
    queue_names: dict[int, str] = {}
    for i, unit in enumerate(units):
        claims = [c for p in unit.placements for c in p.claims]
        if not claims:
            continue
        name, refused = _leaf_of(claims[0], tree)
        if refused is not None:
            verdicts[i] = refused
        else:
            queue_names[i] = name
    if not queue_names:
        return verdicts
    _lock(tree, set(queue_names.values()))
    state = _State(tree, view, now)
    charges: list[QuotaCharge] = []
    for i, name in queue_names.items():
        verdict, unit_charges = state.try_admit(units[i], name)
        verdicts[i] = verdict
        charges.extend(unit_charges)
    if charges:
        queues_sql.delete_charges([c.claim_id for c in charges])  # a re-admitted claim (after preemption)
    # COPY, not bulk_create: building and adapting a model row per claim is CPU spent under the commit's
    # locks, which every other commit waits for.
    bulk_insert(QuotaCharge, CHARGE_COLUMNS, charges, json_columns=set())
    return verdicts


def dry_admit(unit, view, now=None, tree: Tree | None = None) -> queueing.Verdict:
    """What ``admit`` would answer for one placed ``unit`` now, on a copy: no lock taken, nothing charged
    (``POST /api/v1/simulate``; the commit decides again under its locks)."""
    tree = tree or Tree.load()
    claims = [c for p in unit.placements for c in p.claims]
    name, refused = _leaf_of(claims[0], tree)
    if refused is not None:
        return refused
    return _State(tree, view, now).try_admit(unit, name)[0]


def _leaf_of(claim, tree: Tree) -> tuple[str, queueing.Verdict | None]:
    """The claim's queue, and the verdict when it is not a leaf queue that exists."""
    name = queue_of(claim, claim.namespace.name, tree)
    if name not in tree.queues:
        return name, queueing.Verdict(queueing.QUEUE_DOES_NOT_EXIST, f'queue "{name}" does not exist (yet); the '
                                      "claim waits for it", name)
    if not tree.is_leaf(name):
        return name, queueing.Verdict(queueing.WAITING_FOR_QUOTA, f'queue "{name}" has child queues; only leaf '
                                      "queues take claims", name)
    return name, None


def _lock(tree: Tree, names: set[str]) -> None:
    """Steps 1 and 2 of the module docstring, rows first. The root lock is taken exclusive only when a queue of
    these chains has a quota entry (only then does admission read usage, its own chains' and, to borrow, the
    other top-level queues'); a commit whose chains have none (``default`` alone, the common case) admits
    whatever it placed, so it takes the root lock shared: such commits of different workers do not wait for
    each other, and an exclusive holder still sees every charge they committed and none in flight. The rows
    are locked ``FOR SHARE`` (a queue update waits for both kinds; two commits do not), before the root lock,
    so that the rows decide the mode: an edit that added a quota is seen. Nothing else is locked after the
    root lock, and queue edits never take it, so the order cannot deadlock."""
    ids = sorted({q.id for name in names for q in tree.chain(name)})
    if connection.vendor != "postgresql":
        fresh = list(Queue.objects.filter(id__in=ids).order_by("id"))  # SQLite serializes writers
    else:
        table = connection.ops.quote_name(Queue._meta.db_table)
        with locking.waiting():
            fresh = list(Queue.objects.raw(f"SELECT * FROM {table} WHERE id = ANY(%s) ORDER BY id FOR SHARE", [ids]))
            exclusive = any(q.spec.get("quotas") for q in fresh)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)" if exclusive else
                               "SELECT pg_advisory_xact_lock_shared(%s)", [ROOT_LOCK])
    for q in fresh:  # the rows as they are now that nobody can change them
        tree.queues[q.name] = q


class _State:
    """Usage under the locks, plus what this commit admitted so far."""

    def __init__(self, tree: Tree, view, now) -> None:
        self.tree, self.view, self.now = tree, view, now or timezone.now()
        self._usage: u.Usage | None = None
        self._added: u.Usage = {}  # charged by this commit before usage was read
        self._withheld: list[reservations.Withheld] | None = None
        self._unit = None  # the unit being checked
        self._owed: list[debts.Owed] | None = None  # read with usage: quota a reclaim freed for its preemptor
        self._settled: set[int] = set()  # preemptors checked now or admitted: their debt is not counted
        self._lending: dict[tuple[str, str], int] | None = None  # (reservation, class) -> its devices on their nodes
        self.labels = dict(view.cluster_labels) if view is not None else {}
        self.by_id = {q.id: q for q in tree.queues.values()}
        self.children: dict[int | None, list[int]] = defaultdict(list)
        for q in tree.queues.values():
            self.children[q.parent_id].append(q.id)

    @property
    def usage(self) -> u.Usage:
        """Read on first need (under the locks, so the same as up front): usage sums the charges of every
        Allocated claim, and a commit whose queues have no quota entry for what it uses (the default queue
        alone, the common case) never needs it."""
        if self._usage is None:
            self._usage = u.load()
            self._owed = debts.owed(self.tree, self.now)
            for key, amount in self._added.items():
                self._usage[key] = self._usage.get(key, Fraction(0)) + amount
        return self._usage

    def withheld(self, cls: str) -> int:
        """Devices of ``cls`` the reservations inside their held spans take from what queues may borrow (read
        once, on first need: only a borrower's check needs it)."""
        if self._withheld is None:
            self._withheld = reservations.withholding(self.now)
        if self._lending is None:
            self._lending = self._lent_to(self._unit) if self._withheld and self._unit is not None else {}
        return sum(w.amount(cls, self._lending.get((w.name, cls), 0)) for w in self._withheld)

    def _lent_to(self, unit) -> dict[tuple[str, str], int]:
        """(reservation, class) -> the unit's devices placed on the nodes it holds (lent to the unit)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for w in self._withheld or []:
            for p in unit.placements:
                if (p.cluster, getattr(p, "node", "")) not in w.nodes:
                    continue
                for claim, a in zip(p.claims, p.allocations, strict=True):
                    for (cls, unit_name, _), amount in u.needs([_one(p, claim, a)], self.view).get(
                            p.cluster, {}).items():
                        if unit_name == "devices":
                            out[(w.name, cls)] += int(amount)
        return out

    def subtree(self, queue: Queue) -> set[int]:
        out, todo = set(), [queue.id]
        while todo:
            qid = todo.pop()
            out.add(qid)
            todo.extend(self.children.get(qid, ()))
        return out

    def used(self, queue: Queue, key: tuple[str, str, str], clusters: set[str] | None) -> Fraction:
        """What ``queue``'s subtree uses of ``key``, plus the devices owed to its preemptors (``debts``) other
        than the unit's own."""
        ids = self.subtree(queue)
        total = sum((amount for (qid, cls, unit, res, cluster), amount in self.usage.items()
                     if qid in ids and (cls, unit, res) == key and (clusters is None or cluster in clusters)),
                    Fraction(0))
        if clusters is None and key[1] == "devices":
            total += sum(o.devices for o in self._owed or () if o.queue_id in ids and o.device_class == key[0]
                         and o.claim_id not in self._settled)
        return total

    def entry(self, queue: Queue, cls: str, cluster: str) -> dict | None:
        """The queue's quota entry for ``cls`` covering ``cluster`` (a selector-specific one first)."""
        found = None
        for q in queue.spec.get("quotas") or []:
            if q.get("deviceClassName") != cls:
                continue
            selector = q.get("clusterSelector")
            if selector is None:
                found = found or q
            elif cluster in (clusters_matching(selector["matchLabels"], list(self.labels.items())) or []):
                return q
        return found

    def covered(self, entry: dict) -> set[str] | None:
        selector = entry.get("clusterSelector")
        if selector is None:
            return None
        return set(clusters_matching(selector["matchLabels"], list(self.labels.items())) or [])

    def try_admit(self, unit, name: str) -> tuple[queueing.Verdict, list[QuotaCharge]]:
        leaf = self.tree.queues[name]
        chain = self.tree.chain(name)
        per_claim = [(claim, p.cluster, u.needs([_one(p, claim, a)], self.view).get(p.cluster, {}))
                     for p in unit.placements for claim, a in zip(p.claims, p.allocations, strict=True)]
        total: dict[tuple[str, tuple], Fraction] = defaultdict(Fraction)
        for _, cluster, need in per_claim:
            for key, amount in need.items():
                total[(cluster, key)] += amount
        self._unit, self._lending = unit, None
        mine = {claim.id for claim, _, _ in per_claim} - self._settled
        self._settled |= mine  # what it is owed is what it asks for now: not counted twice
        for (cluster, key), amount in sorted(total.items()):
            why = self.check(leaf, chain, cluster, key, amount)
            if why is not None:
                self._settled -= mine  # refused: still owed to it, for the units after it
                return why, []
        charges = []
        for claim, cluster, need in per_claim:
            for (cls, unit_name, res), amount in need.items():
                usage_key = (leaf.id, cls, unit_name, res, cluster)
                counted = self._usage if self._usage is not None else self._added
                counted[usage_key] = counted.get(usage_key, Fraction(0)) + amount
                charges.append(QuotaCharge(claim_id=claim.id, queue_id=leaf.id, device_class=cls, unit=unit_name,
                                           resource=res, amount=u.to_decimal(amount), cluster=cluster,
                                           created_at=self.now))
        return queueing.Verdict(queueing.ADMITTED, f'admitted to queue "{name}"', name), charges

    def check(self, leaf: Queue, chain: list[Queue], cluster: str, key: tuple[str, str, str],
              amount: Fraction) -> queueing.Verdict | None:
        cls, unit_name, res = key
        what = f"{cls} {unit_name}" + (f" {res}" if res else "")
        if self.entry(leaf, cls, cluster) is None and leaf.name != DEFAULT_QUEUE:
            return queueing.Verdict(queueing.NO_QUOTA_FOR_CLASS, f'queue "{leaf.name}" has no quota for device '
                                    f'class "{cls}" on cluster {cluster}', leaf.name)
        for queue in chain:
            entry = self.entry(queue, cls, cluster)
            if not entry:
                continue
            limits = _limits(entry, unit_name, res)
            if limits is None:
                continue
            after = self.used(queue, key, self.covered(entry)) + amount
            nominal = Fraction(queue_spec.amount_of(limits.get("nominal", 0)) or 0)
            borrowing = limits.get("borrowingLimit")
            if borrowing is not None and after > nominal + Fraction(queue_spec.amount_of(borrowing)):
                return queueing.Verdict(queueing.WAITING_FOR_QUOTA, (
                    f'queue "{queue.name}": {what} in use would be {quantity(after, res)}, over nominal '
                    f'{quantity(nominal, res)} + '
                    f"borrowingLimit {borrowing}"), leaf.name)
            if after > nominal and entry.get("clusterSelector") is None and not self.fits_beside_siblings(
                    queue, key, after):
                where = ("other queues" if queue.parent_id is None else
                         f'its sibling queues under "{self.by_id[queue.parent_id].name}"')
                held = self.withheld(cls) if unit_name == "devices" and self._withheld else 0
                return queueing.Verdict(queueing.WAITING_FOR_QUOTA, (
                    f'queue "{queue.name}" would borrow {what} that {where} keep for themselves (their nominal '
                    "beyond lendingLimit)" + (f" or reservations hold ({held} from their start minus lead time "
                                              "to their end)" if held else "")), leaf.name)
        return None

    def fits_beside_siblings(self, borrower: Queue, key: tuple[str, str, str], after: Fraction) -> bool:
        """``lendingLimit`` at the borrower's level of the tree: what its siblings keep for themselves
        (``nominal - lendingLimit``, where idle) must stay free within what their parent may use (its nominal
        plus borrowingLimit; for the top level or a parent that may borrow without limit, the fleet's devices
        of the class)."""
        kept_total = Fraction(0)
        for qid in self.children.get(borrower.parent_id, ()):
            other = self.by_id[qid]
            if other.id == borrower.id:
                continue
            entry = self.entry(other, key[0], "")
            limits = _limits(entry, key[1], key[2]) if entry else None
            kept = Fraction(0)
            if limits is not None and limits.get("lendingLimit") is not None:
                kept = Fraction(queue_spec.amount_of(limits["nominal"])) - Fraction(
                    queue_spec.amount_of(limits["lendingLimit"]))
            kept_total += max(self.used(other, key, None), kept)
        withheld = self.withheld(key[0]) if key[1] == "devices" and self.fleet_room(borrower.parent_id, key) else 0
        if not kept_total and not withheld:
            return True  # nobody keeps anything: the engine's placement is the only bound
        capacity = self.room_under(borrower.parent_id, key)
        return capacity is None or kept_total + after + withheld <= capacity

    def fleet_room(self, parent_id: int | None, key: tuple[str, str, str]) -> bool:
        """Is the room of ``parent_id``'s children the fleet's (the top level, or a parent without
        borrowingLimit)? Only there do reservations take their part: they hold the fleet's devices."""
        parent = self.by_id.get(parent_id) if parent_id is not None else None
        if parent is None:
            return True
        entry = self.entry(parent, key[0], "")
        limits = _limits(entry, key[1], key[2]) if entry else None
        return limits is None or limits.get("borrowingLimit") is None

    def room_under(self, parent_id: int | None, key: tuple[str, str, str]) -> Fraction | None:
        """What the children of ``parent_id`` may use together, or None when that is not known here."""
        parent = self.by_id.get(parent_id) if parent_id is not None else None
        if parent is not None:
            entry = self.entry(parent, key[0], "")
            limits = _limits(entry, key[1], key[2]) if entry else None
            if limits is not None and limits.get("borrowingLimit") is not None:
                return Fraction(queue_spec.amount_of(limits.get("nominal", 0)) or 0) + Fraction(
                    queue_spec.amount_of(limits["borrowingLimit"]))
        if key[1] != "devices":
            return None  # counters and capacity of the whole fleet are not counted here
        capacity = class_capacity(self.view, key[0])
        return None if capacity is None else Fraction(capacity)


def _limits(entry: dict, unit_name: str, res: str) -> dict | None:
    value = entry.get(unit_name)
    if value is None:
        return None
    return value if unit_name == "devices" else value.get(res)


class _One(NamedTuple):
    """One claim of a placement, in the shape ``usage.needs`` reads."""

    claims: list
    allocations: list
    cluster: str


def _one(p, claim, allocation) -> _One:
    return _One([claim], [allocation], p.cluster)


def class_capacity(view, cls: str) -> int | None:
    """Devices of the fleet the class selects, counted by the claims round's cached engine (None when that
    engine is not for this view: the guarantee check is then left to the next commit)."""
    engine = engines.engine
    if engine is None or view is None or engines.key != view.key:
        return None
    if _capacity_cache["key"] != view.key:
        _capacity_cache.update(key=view.key, classes={})
    cached = _capacity_cache["classes"].get(cls)
    if cached is None:
        klass = engine.get_class(None, cls)
        if klass is None:
            return None
        exprs = tuple(((s or {}).get("cel") or {}).get("expression", "")
                      for s in (klass.get("spec") or {}).get("selectors") or [])
        sel = engine.selector_set(cls, exprs, ())
        cached = _capacity_cache["classes"][cls] = sum(1 for d in engine.devices if sel.evaluate(d) is MATCH)
    return cached
