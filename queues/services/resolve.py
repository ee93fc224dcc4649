"""Which queue a claim belongs to, and its priority there.

A claim names a queue with the label ``draservice.io/queue`` (or Kueue's ``kueue.x-k8s.io/queue-name``, or
KAI's ``kai.scheduler/queue``, read for manifests written for those schedulers); otherwise its namespace's
queue (the one listing it); otherwise ``default``. Resolution is computed, not stored: a queue created,
changed or deleted takes effect for pending claims at once, and nothing per claim has to be kept in step.
A queue deleted with ``?force=true`` leaves a redirect so the claims that named it go to ``default``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Q

from queues import queues_sql
from queues.models import DEFAULT_QUEUE, Queue, QueueNamespace, QueueRedirect

QUEUE_LABEL = "draservice.io/queue"
QUEUE_LABELS = (QUEUE_LABEL, "kueue.x-k8s.io/queue-name", "kai.scheduler/queue")
PRIORITY_LABEL = "draservice.io/priority"


@dataclass
class Tree:
    """All queues, read in one query (a handful of rows): name -> Queue, namespace -> queue name (from the
    specs), and, loaded only when asked, the redirects of force-deleted queues."""

    queues: dict[str, Queue]
    by_namespace: dict[str, str]
    _redirects: dict[str, object] | None = None

    @classmethod
    def load(cls) -> Tree:
        queues = {q.name: q for q in queues_sql.all_queues()}
        if DEFAULT_QUEUE not in queues:  # a flushed database (tests); normally the data migration made it
            queues[DEFAULT_QUEUE] = ensure_default()
        by_namespace = {ns: q.name for q in queues.values() for ns in q.spec.get("namespaces") or []}
        return cls(queues=queues, by_namespace=by_namespace)

    @classmethod
    def at(cls, stamp: str) -> Tree:
        """The tree as of the fleet state ``stamp`` (``claims.FleetState``'s version and the transaction that
        wrote it, read by the caller before this call) or later. Every queue write moves the fleet version in
        its own transaction (``bump_fleet_version``: queues, their namespaces, redirects), so a tree read after
        the stamp was read holds every queue write up to it; the writer's transaction is in the stamp because a
        version alone repeats after a rollback. Kept per process, one stamp at a time, so that the claims' writer
        answers with a claim's queue without reading the queues (it reads the stamp in its INSERT). READ ONLY:
        the tree is shared by every thread of the process."""
        global _at
        hit = _at
        if hit is not None and hit[0] == stamp:
            return hit[1]
        tree = cls.load()
        _at = (stamp, tree)
        return tree

    @property
    def redirects(self) -> dict[str, object]:
        """name -> deleted at, of queues deleted with ``?force=true``."""
        if self._redirects is None:
            self._redirects = dict(QueueRedirect.objects.values_list("name", "created_at"))
        return self._redirects

    def chain(self, name: str) -> list[Queue]:
        """The queue and its ancestors, leaf first."""
        by_id = {q.id: q for q in self.queues.values()}
        out, at = [], self.queues.get(name)
        while at is not None and at not in out:
            out.append(at)
            at = by_id.get(at.parent_id) if at.parent_id else None
        return out

    def is_leaf(self, name: str) -> bool:
        queue = self.queues.get(name)
        return queue is not None and not any(q.parent_id == queue.id for q in self.queues.values())


_at: tuple[str, Tree] | None = None  # Tree.at's (stamp, tree)


def ensure_default() -> Queue:
    from queues import spec as queue_spec

    spec, _ = queue_spec.normalize({"metadata": {"name": DEFAULT_QUEUE}})
    try:
        with transaction.atomic():
            return Queue.objects.get_or_create(name=DEFAULT_QUEUE, defaults={"spec": spec["spec"]})[0]
    except IntegrityError:  # created concurrently
        return Queue.objects.get(name=DEFAULT_QUEUE)


def labelled_queue(labels: dict | None) -> tuple[str, str] | None:
    """(label key, queue name) the claim names, if any."""
    for key in QUEUE_LABELS:
        value = (labels or {}).get(key)
        if value:
            return key, value
    return None


def queue_of(claim, namespace: str, tree: Tree) -> str:
    named = labelled_queue(claim.labels)
    if named is not None:
        name = named[1]
        if name not in tree.queues:
            deleted_at = tree.redirects.get(name)
            if deleted_at is not None and claim.created_at is not None and claim.created_at <= deleted_at:
                return DEFAULT_QUEUE
        return name
    return tree.by_namespace.get(namespace, DEFAULT_QUEUE)


def priority_of(claim) -> int:
    try:
        return int((claim.labels or {}).get(PRIORITY_LABEL, 0))
    except (TypeError, ValueError):
        return 0


def effective_priority(claim, queue: Queue | None) -> int:
    """The label's priority, capped by the queue's ``maxPriority`` (a cap lowered after creation applies)."""
    p = priority_of(claim)
    return min(p, queue.max_priority) if queue is not None else p


def claims_of_queue_q(name: str, namespaces: list[str]) -> Q:
    """Claims (a ResourceClaim filter) that belong to queue ``name`` listing ``namespaces``."""
    named = Q()
    for key in QUEUE_LABELS:
        # A key transform, not ``labels__contains``: SQLite (the embedded default) has no JSON containment.
        named |= Q(**{f"labels__{key}": name})
    unlabelled = Q()
    for key in QUEUE_LABELS:
        unlabelled &= ~Q(labels__has_key=key)
    if name == DEFAULT_QUEUE:
        listed = QueueNamespace.objects.values("namespace")
        return named | (unlabelled & ~Q(namespace__name__in=listed))
    return named | (unlabelled & Q(namespace__name__in=namespaces))


def check_new_claims(namespace: str, claims: list[tuple[str, object]], unit: bool) -> list[tuple[str, str]]:
    """Field errors for claims about to be created (or joined into one unit of admission)."""
    if not unit and not any(labelled_queue(getattr(c, "labels", None)) or PRIORITY_LABEL in (
            getattr(c, "labels", None) or {}) for _, c in claims):
        return []  # nothing names a queue or a priority: nothing to check (and no query on the hot path)
    tree = Tree.load()
    errors: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for path, claim in claims:
        labels = getattr(claim, "labels", None) or {}
        prefix = f"{path}.metadata.labels" if path else "metadata.labels"
        named = labelled_queue(labels)
        name = queue_of(claim, namespace, tree)
        queue = tree.queues.get(name)
        if named is not None and queue is not None and name != DEFAULT_QUEUE \
                and namespace not in (queue.spec.get("namespaces") or []):
            errors.append((f"{prefix}[{named[0]}]", f'Forbidden: namespace "{namespace}" may not use queue '
                                                    f'"{name}" (not in its spec.namespaces)'))
        raw = labels.get(PRIORITY_LABEL)
        if raw is not None:
            try:
                value = int(raw)
            except (TypeError, ValueError):
                errors.append((f"{prefix}[{PRIORITY_LABEL}]", f"Invalid value: {raw!r}: must be an integer"))
            else:
                cap = queue.max_priority if queue is not None else None
                if cap is not None and value > cap:
                    errors.append((f"{prefix}[{PRIORITY_LABEL}]", f"Invalid value: {value}: over the maxPriority "
                                                                  f"({cap}) of queue \"{name}\""))
        if unit:
            seen.setdefault(name, path)
    if unit and len(seen) > 1:
        errors.append((claims[0][0] or "metadata.labels",
                       "Invalid value: claims allocated together (a consumer's, a gang's) must all belong to one "
                       f"queue; these go to {', '.join(sorted(seen))}"))
    return errors


def check_label_change(claim, labels: dict) -> list[tuple[str, str]]:
    """New labels of an existing claim: the creation rules, and no other queue once it is admitted."""
    changed = copy.copy(claim)
    changed.labels = labels
    errors = check_new_claims(claim.namespace.name, [("", changed)], unit=False)
    if claim.phase == "Allocated":
        tree = Tree.load()
        before, after = queue_of(claim, claim.namespace.name, tree), queue_of(changed, claim.namespace.name, tree)
        if before != after:
            key = (labelled_queue(labels) or labelled_queue(claim.labels) or (QUEUE_LABEL, ""))[0]
            errors.append((f"metadata.labels[{key}]", f'Forbidden: the claim is admitted to queue "{before}"; its '
                                                      "queue cannot change until it is released"))
    return errors
