"""Creating, replacing, patching and deleting queues: one writer, one lock, nothing half-stored.

Every queue write takes one transaction-scoped advisory lock (``WRITE_LOCK``): the checks against the other
queues (parent exists, no cycle, only leaves take claims, a namespace listed once) are then made on a stable
set. Admission does not take that lock; it locks queue rows (``FOR UPDATE``), which an update of a queue row
waits for, so a commit sees a queue's quota either wholly before or wholly after a change.
"""
from __future__ import annotations

import hashlib
import zlib

from django.db import IntegrityError, transaction

from claims.models import Phase, ResourceClaim
from claims.services.taking import bump_fleet_version
from draservice import audit
from draservice.errors import AlreadyExists, Conflict, Invalid
from draservice.etag import check_if_match
from draservice.requests import merge_patch
from queues import queues_sql
from queues import spec as queue_spec
from queues.models import DEFAULT_QUEUE, Queue, QueueNamespace, QueueRedirect, QuotaCharge
from queues.services import resolve, webhooks
from usage.services import decay

WRITE_LOCK = zlib.crc32(b"draservice.queues.write")


def _lock() -> None:
    queues_sql.lock_until_commit(WRITE_LOCK)


def rendered(queue: Queue) -> dict:
    """The stored object (the webhook secret is write-only: never rendered, except once, in the answer to the
    write for which the server generated it)."""
    spec = {k: v for k, v in queue.spec.items()}
    hook = (spec.get("preemption") or {}).get("webhook")
    if hook and "secret" in hook:
        shown = {"url": hook["url"], "secretSet": True}
        secret = getattr(queue, "generated_secret", None)  # set by the write that generated it
        if secret:
            shown["secret"] = secret
        spec["preemption"] = {**spec["preemption"], "webhook": shown}
    return {"apiVersion": queue_spec.API_VERSION, "kind": queue_spec.KIND,
            "metadata": {"name": queue.name, "uid": str(queue.uid), "resourceVersion": str(queue.resource_version),
                         "labels": queue.labels, "annotations": queue.annotations,
                         "creationTimestamp": queue.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "spec": spec}


def create_queue(body) -> Queue:
    obj = _valid(body, None)
    with transaction.atomic():
        _lock()
        if Queue.objects.filter(name=obj["metadata"]["name"]).exists():
            raise AlreadyExists([("metadata.name", f'queues "{obj["metadata"]["name"]}" already exists')])
        generated = webhooks.ensure_secret(obj["spec"])
        queue = _store(Queue(name=obj["metadata"]["name"]), obj, creating=True)
    return _shown(queue, generated)


def replace_queue(name: str, body, if_match: list[str] | None) -> tuple[Queue, bool]:
    obj = _valid(body, name)
    with transaction.atomic():
        _lock()
        queue = Queue.objects.select_for_update().filter(name=name).first()
        if queue is None:
            if if_match is not None:
                check_if_match(if_match, 0)
            generated = webhooks.ensure_secret(obj["spec"])
            return _shown(_store(Queue(name=name), obj, creating=True), generated), True
        check_if_match(if_match, queue.resource_version)
        _keep_secret(queue, obj)
        generated = webhooks.ensure_secret(obj["spec"])
        return _shown(_store(queue, obj, creating=False), generated), False


def patch_queue(name: str, patch, if_match: list[str] | None) -> Queue:
    if not isinstance(patch, dict):
        raise Invalid([("", "a merge patch must be an object")])
    with transaction.atomic():
        _lock()
        queue = Queue.objects.select_for_update().get(name=name)
        check_if_match(if_match, queue.resource_version)
        current = {"apiVersion": queue_spec.API_VERSION, "kind": queue_spec.KIND,
                   "metadata": {"name": queue.name, "labels": queue.labels, "annotations": queue.annotations},
                   "spec": queue.spec}
        obj = _valid(merge_patch(current, patch), name)
        _keep_secret(queue, obj)
        generated = webhooks.ensure_secret(obj["spec"])
        return _shown(_store(queue, obj, creating=False), generated)


def delete_queue(name: str, if_match: list[str] | None, force: bool = False) -> None:
    with transaction.atomic():
        _lock()
        queue = Queue.objects.select_for_update().get(name=name)
        check_if_match(if_match, queue.resource_version)
        if name == DEFAULT_QUEUE:
            raise Conflict("The default queue always exists; it cannot be deleted.")
        children = list(queue.children.values_list("name", flat=True))
        if children:
            raise Conflict(f"Queue {name!r} is the parent of {', '.join(sorted(children))}; delete or move them first.")
        held = holding(queue)
        if held and not force:
            raise Conflict(f"Queue {name!r} holds {held} claims (pending or allocated); delete with ?force=true to "
                           f"move them to the {DEFAULT_QUEUE!r} queue.")
        default = Queue.objects.get(name=DEFAULT_QUEUE)
        # Moving: admitted claims' charges go to default; claims naming the queue by label resolve to default
        # (the redirect), and its namespaces, no longer listed, fall back to default by themselves.
        QuotaCharge.objects.filter(queue=queue).update(queue=default)
        QueueRedirect.objects.update_or_create(name=name)
        audit.record(queue_spec.KIND, name, audit.DELETE, audited(queue), None)
        decay.configure(name, 0)
        queue.delete()
        bump_fleet_version()


def audited(queue: Queue) -> dict:
    """What the audit trail records of a queue: its spec (the webhook secret as a fingerprint, so a new secret
    shows as a change without being kept), labels and annotations."""
    spec = queue.spec
    hook = (spec.get("preemption") or {}).get("webhook")
    if hook and hook.get("secret"):
        digest = hashlib.sha256(str(hook["secret"]).encode()).hexdigest()[:12]
        spec = {**spec, "preemption": {**spec["preemption"], "webhook": {**hook, "secret": f"sha256:{digest}"}}}
    return {"metadata": {"labels": queue.labels, "annotations": queue.annotations}, "spec": spec}


def class_warnings(queue: Queue) -> list[str]:
    """Warnings for quotas naming a DeviceClass that exists nowhere in the fleet. Accepted, as Kubernetes accepts
    references to absent classes (the class may be created next); a typo would otherwise go unnoticed."""
    from inventory.models import DeviceClass

    named = [(i, q["deviceClassName"]) for i, q in enumerate(queue.spec.get("quotas") or [])
             if q.get("deviceClassName")]
    if not named:
        return []
    known = set(DeviceClass.objects.filter(name__in={n for _, n in named}).values_list("name", flat=True))
    return [f"spec.quotas[{i}].deviceClassName: DeviceClass {n} not found; this quota covers no device until "
            "it exists" for i, n in named if n not in known]


def holding(queue: Queue) -> int:
    """Claims, pending or allocated, that belong to ``queue``."""
    live = ResourceClaim.objects.filter(phase__in=[Phase.PENDING, Phase.ALLOCATED])
    return live.filter(resolve.claims_of_queue_q(queue.name, queue.spec.get("namespaces") or [])).count()


def _valid(body, url_name: str | None) -> dict:
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict) and url_name \
            and not body["metadata"].get("name"):
        body = {**body, "metadata": {**body["metadata"], "name": url_name}}
    obj, errors = queue_spec.normalize(body, url_name)
    if errors:
        raise Invalid(errors)
    return obj


def _shown(queue: Queue, generated: str | None) -> Queue:
    queue.generated_secret = generated  # type: ignore[attr-defined]  # rendered once, by this write's answer
    return queue


def _keep_secret(queue: Queue, obj: dict) -> None:
    """A PUT/PATCH that names the same webhook URL without a secret keeps the stored secret."""
    old = (queue.spec.get("preemption") or {}).get("webhook") or {}
    new = (obj["spec"].get("preemption") or {}).get("webhook")
    if new and "secret" not in new and old.get("url") == new.get("url") and old.get("secret"):
        new["secret"] = old["secret"]


def _store(queue: Queue, obj: dict, creating: bool) -> Queue:
    """Checks against the other queues (under ``WRITE_LOCK``), then the row and its namespace rows."""
    spec = obj["spec"]
    errors = _tree_errors(queue, spec)
    if errors:
        raise Invalid(errors)
    if not creating and spec == queue.spec and obj["metadata"]["labels"] == queue.labels \
            and obj["metadata"]["annotations"] == queue.annotations:
        return queue  # nothing changed: same ETag
    before = None if creating else audited(queue)
    queue.spec = spec
    queue.labels, queue.annotations = obj["metadata"]["labels"], obj["metadata"]["annotations"]
    queue.parent = Queue.objects.get(name=spec["parent"]) if spec.get("parent") else None
    queue.weight, queue.priority, queue.max_priority = spec["weight"], spec["priority"], spec["maxPriority"]
    if not creating:
        queue.resource_version += 1
    try:
        with transaction.atomic():
            queue.save()
            QueueNamespace.objects.filter(queue=queue).delete()
            QueueNamespace.objects.bulk_create([QueueNamespace(namespace=ns, queue=queue)
                                                for ns in spec["namespaces"]])
    except IntegrityError as exc:  # only a writer bypassing WRITE_LOCK gets here
        raise Invalid([("spec.namespaces", "a namespace is listed by another queue")]) from exc
    if creating:
        QueueRedirect.objects.filter(name=queue.name).delete()
    audit.record(queue_spec.KIND, queue.name, audit.CREATE if creating else audit.UPDATE, before, audited(queue))
    decay.configure(queue.name, queue_spec.half_life(spec))  # from the ledger when the half-life is new
    bump_fleet_version()  # claims waiting for quota or for this queue are tried again
    return queue


def _tree_errors(queue: Queue, spec: dict) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    others = {q.name: q for q in Queue.objects.exclude(name=queue.name).only("id", "name", "parent_id", "spec")}
    names_by_id = {q.id: q.name for q in others.values()}
    parent = spec.get("parent")
    if queue.name == DEFAULT_QUEUE and (parent or spec["namespaces"]):
        errors.append(("spec.parent" if parent else "spec.namespaces",
                       "Forbidden: the default queue sits under the root and takes the claims no queue lists"))
    if parent:
        if parent not in others:
            errors.append(("spec.parent", f'Not found: queue "{parent}" does not exist'))
        else:
            if queue.pk:
                names_by_id[queue.pk] = queue.name
            seen: set[str] = {queue.name}
            at: str | None = parent
            while at:
                if at in seen:
                    errors.append(("spec.parent", f'Invalid value: "{parent}": makes a cycle '
                                                  f'({queue.name} -> {parent} -> ... -> {queue.name})'))
                    break
                seen.add(at)
                row = others.get(at)
                at = names_by_id.get(row.parent_id) if row is not None and row.parent_id else None
            if others[parent].spec.get("namespaces"):
                errors.append(("spec.parent", f'Invalid value: "{parent}": takes claims (lists namespaces); '
                                              "only leaf queues take claims"))
            if parent == DEFAULT_QUEUE:
                errors.append(("spec.parent", 'Invalid value: "default": the default queue takes claims and '
                                              "cannot have children"))
    if spec["namespaces"] and queue.pk and queue.children.exists():
        errors.append(("spec.namespaces", "Forbidden: a queue with children cannot take claims"))
    taken = dict(QueueNamespace.objects.filter(namespace__in=spec["namespaces"]).exclude(queue__name=queue.name)
                 .values_list("namespace", "queue__name"))
    for i, ns in enumerate(spec["namespaces"]):
        if ns in taken:
            errors.append((f"spec.namespaces[{i}]", f'Duplicate value: "{ns}": already listed by queue '
                                                    f'"{taken[ns]}"'))
    return errors
