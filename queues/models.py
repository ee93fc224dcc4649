"""Queues: fleet-wide quota, fair share and priority for the claims of many teams (``draservice.io/v1alpha1``).

``Queue`` holds the normalized object (``spec``) plus the columns admission reads. ``QueueNamespace`` makes
"one namespace, one queue" a database fact (a unique index), so two concurrent writes cannot both list it.
``QuotaCharge`` is what an admitted claim counts against its queue: one row per (claim, class, unit,
resource), written by admission in the commit's transaction. A queue's usage is the sum of the charges of
its claims that are still Allocated, so every way a claim stops holding devices (release, lease expiry,
deletion, gang release) gives its quota back without a hook: the charge stops counting, or is deleted with
the claim.
"""
from __future__ import annotations

import uuid

from django.db import models

API_VERSION = "draservice.io/v1alpha1"
KIND = "Queue"
DEFAULT_QUEUE = "default"


class Queue(models.Model):
    name = models.CharField(max_length=63, unique=True)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    resource_version = models.BigIntegerField(default=1)
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField(default=dict)  # normalized spec (queues.spec.normalize)
    # The spec's parent as a row; PROTECT: a parent cannot vanish under its children.
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="children")
    weight = models.FloatField(default=1.0)
    priority = models.IntegerField(default=0)
    max_priority = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name

    @property
    def etag(self) -> str:
        return f'"{self.resource_version}"'


class QueueNamespace(models.Model):
    """``spec.namespaces`` of a queue, one row each: the unique index refuses a second queue listing it."""

    namespace = models.CharField(max_length=63, unique=True)
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="namespace_rows")


class QueueRedirect(models.Model):
    """A queue deleted with ``?force=true``: claims created before ``created_at`` that name it go to
    ``default``. Removed when a queue of that name is created again."""

    name = models.CharField(max_length=63, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)


class Unit(models.TextChoices):
    DEVICES = "devices"
    COUNTERS = "counters"
    CAPACITY = "capacity"


class QuotaCharge(models.Model):
    claim = models.ForeignKey("claims.ResourceClaim", on_delete=models.CASCADE, related_name="quota_charges")
    # No index of its own: queues_charge_queue (queue, device_class) leads with it.
    queue = models.ForeignKey(Queue, on_delete=models.PROTECT, related_name="charges", db_index=False)
    device_class = models.CharField(max_length=253)
    unit = models.CharField(max_length=16, choices=Unit.choices)
    resource = models.CharField(max_length=253, blank=True, default="")  # counter / capacity name
    amount = models.DecimalField(max_digits=40, decimal_places=9)
    cluster = models.CharField(max_length=63, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["queue", "device_class"], name="queues_charge_queue")]


class PreemptionState(models.TextChoices):
    PENDING = "PreemptionPending"  # marked; the victim holds its devices until the deadline
    DONE = "Preempted"  # requeued: devices freed, the claim Pending again
    CANCELLED = "PreemptionCancelled"  # withdrawn before the devices moved: the victim kept them


class Preemption(models.Model):
    """One victim claim of one preemption decision, from its notice to its requeue."""

    victim = models.ForeignKey("claims.ResourceClaim", on_delete=models.CASCADE, related_name="preemptions")
    preemptor = models.ForeignKey("claims.ResourceClaim", on_delete=models.SET_NULL, null=True, blank=True,
                                  related_name="+")
    queue = models.CharField(max_length=63)  # the victim's queue (its policy set the grace period)
    # A reservation's reclaim at its start minus its lead time (no preemptor claim): kept by the re-check.
    reservation = models.CharField(max_length=63, blank=True, default="")
    state = models.CharField(max_length=32, choices=PreemptionState.choices, default=PreemptionState.PENDING)
    deadline = models.DateTimeField()  # forceAt: the devices move then at the latest
    stop_by = models.DateTimeField(null=True, blank=True)  # the notice's stopBy (notice time + graceSeconds)
    confirmed_at = models.DateTimeField(null=True, blank=True)  # the victim stopped (null: forced at the deadline)
    confirmed_by = models.CharField(max_length=255, blank=True, default="")
    webhook_status = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["deadline"], condition=models.Q(state="PreemptionPending"),
                                name="queues_preemption_due"),
                   # The recent requeues, read by every admission that borrows (``queues.services.owed``).
                   models.Index(fields=["finished_at"], condition=models.Q(state="Preempted"),
                                name="queues_preemption_requeued")]


class Reservation(models.Model):
    """Capacity booked for a future window (``queues.reservation_spec``), fleet-wide like a queue. ``held`` is
    the occurrence the scheduler holds capacity for now (from its start minus the lead time to its end): its
    times and the (cluster, node) pairs held, written by ``scheduler.services.reservations``; ``degraded``
    says what it could not hold (empty: everything)."""

    name = models.CharField(max_length=63, unique=True)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    resource_version = models.BigIntegerField(default=1)
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField(default=dict)  # normalized spec (queues.reservation_spec.normalize)
    held = models.JSONField(default=dict, blank=True)
    degraded = models.TextField(blank=True, default="")
    started = models.JSONField(default=dict, blank=True)  # occurrence start -> seconds late its first claim ran
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name
