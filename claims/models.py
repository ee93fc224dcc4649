"""Claims: tenants (namespaces), ResourceClaims and their templates, consumers, and the devices in use.

The Kubernetes objects are stored as columns plus the normalized v1 JSON (``spec``); what the API returns is
rebuilt from them by ``claims.api.serializers``. Everything that changes state goes through
``claims.services``; views and tasks never write these models themselves.

The no-double-allocation guarantee lives in ``DeviceAllocation`` (see its docstring).
"""
from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models import Q

from dra.k8s.fields import V1
from draservice.models import Versioned


class Namespace(models.Model):
    """A tenant: a team or a pipeline. Tokens are scoped to namespace names."""

    name = models.CharField(max_length=63, unique=True)
    labels = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ObjectQuota(models.Model):
    """One namespace's object-count caps, set by an admin (``/api/v1/namespaces/{ns}/objectquota``); a cap left
    null is the setting's default. Keyed by name: a namespace comes into being with its first object, and an
    admin may set its caps before that."""

    namespace = models.CharField(max_length=63, unique=True)
    pending_claims = models.IntegerField(null=True, blank=True)
    pool_status_requests = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.namespace


class Phase(models.TextChoices):
    PENDING = "Pending"
    ALLOCATED = "Allocated"
    RELEASED = "Released"
    FAILED = "Failed"


class ResourceClaim(Versioned):
    """A ``resource.k8s.io/v1`` ResourceClaim plus the service's own state.

    ``spec`` is immutable after creation (the API refuses changes). ``allocation`` is exactly the
    ``AllocationResult`` the engine computed; ``cluster``/``node`` say where. ``attempted_version`` is the
    ``FleetState.version`` the last unsuccessful attempt saw: the worker does not retry a claim until the
    fleet has changed since (the engine is deterministic, so the same input gives the same "no").
    """

    # Set on the rows the dashboard lists (frontend.queries.claims): not columns, declared for mypy.
    classes: list[str]
    count: int | None
    waited: timedelta | None
    queue: dict | None

    # No index of its own: the unique (namespace, name) constraint leads with it, and every write of a claim
    # would maintain a second one.
    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="claims", db_index=False)
    name = models.CharField(max_length=253)
    change_seq = models.BigIntegerField(null=True, blank=True, editable=False)  # set by the change-log trigger
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField()  # normalized v1 ResourceClaimSpec
    source_api_version = models.CharField(max_length=64, default=V1)
    # Set when the claim was made from a template for one consumer; deleting the consumer deletes the claim.
    template = models.ForeignKey("ResourceClaimTemplate", on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="claims")
    owner = models.ForeignKey("Consumer", on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="owned_claims")

    # Placement hints (parsed from annotations at creation, see claims/placement.py).
    allowed_cluster_selector = models.JSONField(null=True, blank=True)  # {"label": "value"} equality
    preferred_cluster = models.CharField(max_length=63, blank=True, default="")

    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PENDING)
    reason = models.CharField(max_length=64, blank=True, default="")  # machine-readable, CamelCase
    message = models.TextField(blank=True, default="")
    conditions = models.JSONField(default=list, blank=True)
    cluster = models.CharField(max_length=63, blank=True, default="")
    node = models.CharField(max_length=253, blank=True, default="")
    allocation = models.JSONField(null=True, blank=True)  # v1 AllocationResult
    diagnostics = models.JSONField(null=True, blank=True)  # the engine's account of the last attempt
    attempts = models.IntegerField(default=0)
    attempted_version = models.BigIntegerField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set while a worker decides this claim (``claims.services.taking.take``); others skip it until then.
    taken_until = models.DateTimeField(null=True, blank=True)
    taken_by = models.IntegerField(null=True, blank=True)  # the taking worker's PostgreSQL backend pid

    lease_seconds = models.IntegerField(null=True, blank=True)  # the walltime (draservice.io/lease-ttl)
    # Allocation time + walltime (renewals move it); null while the claim waits: a lease runs from allocation.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_renewed_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    allocated_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    # Set while the ``DeviceRemoved`` condition is True: an inventory push removed a device the claim holds
    # (claims.services.device_removed). A column, so that metrics and the check find such claims by index.
    device_removed_at = models.DateTimeField(null=True, blank=True)
    # Creation + draservice.io/pending-timeout, cleared at the first allocation: the bound on the first wait.
    pending_deadline = models.DateTimeField(null=True, blank=True)
    # A preemption victim's safe release (claims.services.preemption): {stopBy, forceAt, confirmedAt,
    # confirmedBy} as ``status.preemption`` shows it, plus the preemptor's id and the notice time. Kept after the
    # requeue (what happened is still shown); replaced by the next notice.
    preemption = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="claims_claim_unique_name"),
        ]
        indexes = [
            # The worker's queue: pending claims in arrival order. Partial, so it stays small.
            models.Index(fields=["id"], condition=Q(phase="Pending"), name="claims_claim_pending"),
            # The round's eligibility (claims.services.taking.undecided_pending): never tried, or tried
            # before the last wake-all. Without it every round read every pending claim (4,000 rows at the soak).
            models.Index(fields=["attempted_version"], condition=Q(phase="Pending"), name="claims_claim_attempted"),
            # Defragmentation targets holding a node (scheduler.services.holds, read by every round): few, while
            # the pending claims can be thousands. The key is holds.HOLD_UNTIL (models do not import services).
            models.Index(fields=["id"], condition=Q(phase="Pending",
                                                    annotations__has_key="draservice.io/defrag-hold-until"),
                         name="claims_claim_defrag_hold"),
            models.Index(fields=["lease_expires_at"], condition=Q(lease_expires_at__isnull=False),
                         name="claims_claim_lease"),
            models.Index(fields=["pending_deadline"], condition=Q(pending_deadline__isnull=False),
                         name="claims_claim_pending_deadline"),
            models.Index(fields=["cluster", "phase"], name="claims_claim_cluster"),
            models.Index(fields=["cluster"], condition=Q(device_removed_at__isnull=False),
                         name="claims_claim_device_removed"),
            # The most recently released claims (queues.services.estimate's holding-time sample): released
            # claims are kept, so anything that scans them grows with uptime.
            models.Index(fields=["-released_at"], condition=Q(phase="Released"), name="claims_claim_released"),
            # A namespace's pending claims, counted by every create (claims.services.caps): released claims are
            # kept, so the (namespace, name) index would count through all of them.
            models.Index(fields=["namespace"], condition=Q(phase="Pending"), name="claims_claim_ns_pending"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}/{self.name}"


class ResourceClaimTemplate(Versioned):
    """A ``resource.k8s.io/v1`` ResourceClaimTemplate: ``spec`` holds ``{metadata, spec}`` of the claims."""

    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="templates")
    name = models.CharField(max_length=253)
    change_seq = models.BigIntegerField(null=True, blank=True, editable=False)  # set by the change-log trigger
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField()  # ResourceClaimTemplateSpec: {"metadata": {...}, "spec": <v1 claim spec>}
    source_api_version = models.CharField(max_length=64, default=V1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="claims_template_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}/{self.name}"


class Consumer(Versioned):
    """What uses claims: a pod, a CI job. ``spec.resourceClaims`` has the shape of ``Pod.spec.resourceClaims``.

    All pending claims of one consumer are allocated together, on one node, or not at all.
    """

    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="consumers")
    name = models.CharField(max_length=253)
    change_seq = models.BigIntegerField(null=True, blank=True, editable=False)  # set by the change-log trigger
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="claims_consumer_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}/{self.name}"


class Reservation(models.Model):
    """One entry of a claim's ``status.reservedFor``: the claim is reserved for this consumer.

    ``entry`` is the consumer's name for the claim (``spec.resourceClaims[].name``). At most
    ``MAX_RESERVED_FOR`` per claim, counted under the claim's row lock (services.consumers).
    """

    claim = models.ForeignKey(ResourceClaim, on_delete=models.CASCADE, related_name="reservations")
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="reservations")
    entry = models.CharField(max_length=63)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["claim", "consumer"], name="claims_reservation_unique"),
            models.UniqueConstraint(fields=["consumer", "entry"], name="claims_reservation_entry_unique"),
        ]


class DeviceAllocation(models.Model):
    """One device (or one share of a device) held by one claim. Deleting the row frees it.

    The database guarantees that no device is given away twice:

    * a dedicated allocation (``share_id`` empty, not admin access) is unique per (cluster, driver, pool,
      device) by a partial unique index: a second insert fails, whoever commits first wins;
    * shares of an ``allowMultipleAllocations`` device are unique per share ID, and their consumed capacity,
      the counters of partitionable devices, and "a dedicated allocation and shares never coexist" are
      checked by the writer while it holds a lock per device and per counter-carrying pool, taken in one
      sorted order (``claims.services.locking``): PostgreSQL advisory transaction locks, or SQLite's
      IMMEDIATE transactions, which serialize all writers anyway.

    ``admin_access`` rows do not consume the device (upstream semantics) and are outside the constraints.
    """

    # Set on the rows the dashboard lists (frontend.queries.claims): not columns, declared for mypy.
    others: list[DeviceAllocation]
    removed: bool

    claim = models.ForeignKey(ResourceClaim, on_delete=models.CASCADE, related_name="device_allocations")
    cluster = models.CharField(max_length=63)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    device = models.CharField(max_length=63)
    share_id = models.CharField(max_length=64, blank=True, default="")
    consumed_capacity = models.JSONField(null=True, blank=True)
    admin_access = models.BooleanField(default=False)
    request = models.CharField(max_length=127, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "driver", "pool", "device"],
                condition=Q(share_id="", admin_access=False),
                name="claims_alloc_dedicated_unique",
            ),
            models.UniqueConstraint(
                fields=["cluster", "driver", "pool", "device", "share_id"],
                condition=~Q(share_id=""),
                name="claims_alloc_share_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["cluster", "driver", "pool", "device"], name="claims_alloc_device"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.driver}/{self.pool}/{self.device}"


class ClaimEvent(models.Model):
    """The audit trail of a claim. Kept after the claim is deleted (``claim`` becomes null): the row carries
    the claim's namespace, name and uid, by which the events of a deleted claim are still found."""

    claim = models.ForeignKey(ResourceClaim, on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="events")
    namespace = models.CharField(max_length=63)
    claim_name = models.CharField(max_length=253)
    claim_uid = models.UUIDField()
    type = models.CharField(max_length=32)  # Created, AllocationAttempt, Allocated, Released, ...
    reason = models.CharField(max_length=64, blank=True, default="")
    message = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["claim_uid", "id"], name="claims_event_claim"),
                   models.Index(fields=["namespace", "claim_name", "id"], name="claims_event_claim_name")]


class ClaimHistory(models.Model):
    """A claim as it arrived, kept for replay (``scheduler.services.replay_trace``) for ``HISTORY_DAYS`` after
    the claim is gone: insert-only, one row per claim, written in the create's statement (``claims.services
    .claims``, ``claims.services.history``). Allocation and release times are the usage ledger's
    (``usage.models.UsageInterval``, by ``claim_uid``); a claim that never ran ends with its ``Released`` or
    ``Deleted`` ``ClaimEvent``."""

    claim_uid = models.UUIDField()
    namespace = models.CharField(max_length=63)
    claim_name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)  # the queue and priority it named
    spec = models.JSONField()  # its shape: the normalized v1 spec (requests)
    lease_seconds = models.IntegerField(null=True, blank=True)  # the walltime
    created_at = models.DateTimeField()  # the arrival

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["created_at"], name="claims_history_arrival"),
                   models.Index(fields=["claim_uid"], name="claims_history_uid")]


class IdempotencyRecord(models.Model):
    """The first answer to a POST with an ``Idempotency-Key``, replayed for retries with the same body.

    The unique constraint makes two concurrent first attempts race in the database: the loser's insert
    fails (after the winner commits) and it answers with the winner's stored response.
    """

    scope = models.CharField(max_length=255)  # namespace and endpoint
    key = models.CharField(max_length=255)
    body_hash = models.CharField(max_length=64)
    status_code = models.IntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="claims_idempotency_unique")]


class FleetState(models.Model):
    """One row: ``version`` moves with every change that wakes every pending claim (inventory, device classes,
    queues), never with a release: it is the clock pending claims are stamped with (``attempted_version``).

    A claim that failed at V is retried once ``wake_all_version`` is above V, or once a release freed what the
    claim's ``PendingWake`` rows wait for (``claims.services.wake``). The fleet version that also moves with
    every release (gangs, estimates) is ``version`` plus the devices ever freed (``wake.clock_sql``): no row
    on the release path is updated, so releases never wait on each other.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    version = models.BigIntegerField(default=1)
    wake_all_version = models.BigIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)


class WakeKey(models.Model):
    """A counter of devices released in one place (``cluster:<name>``; ``*`` counts every release).

    The counter is ``freed`` plus the ``FreedCount`` rows of the key not rolled up yet: a release only inserts
    those, and ``wake.roll_up`` (the worker, never a release) moves them into ``freed``."""

    key = models.CharField(max_length=100, primary_key=True)
    freed = models.BigIntegerField(default=0)


class FreedCount(models.Model):
    """Devices one release (or preemption move) freed under one wake key. Insert-only on the release path: an
    update of a shared counter row would hold it to the commit, and every other release would wait for it."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=100)
    freed = models.IntegerField()

    class Meta:
        indexes = [models.Index(fields=["key"], name="claims_freedcount_key")]


class PendingWake(models.Model):
    """What a pending claim waits for: it is eligible again once ``key``'s ``freed`` reaches ``wake_at``
    (the counter when it was tried plus the devices it is short of). A claim has any number of rows (one
    suffices); they are replaced with each attempt and dropped once it leaves Pending."""

    claim = models.ForeignKey(ResourceClaim, on_delete=models.CASCADE, related_name="+")
    key = models.ForeignKey(WakeKey, on_delete=models.CASCADE, related_name="+", db_column="key")
    wake_at = models.BigIntegerField()
    short = models.IntegerField(default=1)  # the devices it lacks (wake_at is the counter then plus this)
    # A queue's head that holds a node waits for any release (wake_at = counter + 1) while it is the oldest
    # such head of its queue; younger ones fall back to ``short`` (scheduler.services.queue_holds).
    head_of = models.CharField(max_length=253, blank=True, default="")
    # The node held for that head, kept from round to round (and worker to worker) until the head is decided
    # again: a round that does not decide the head still keeps the node from the claims behind it.
    hold_cluster = models.CharField(max_length=63, blank=True, default="")
    hold_node = models.CharField(max_length=253, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["key", "wake_at"], name="claims_wake_key_at"),
                   models.Index(fields=["head_of", "claim"], condition=~Q(head_of=""), name="claims_wake_head")]


class ReleasedDevice(models.Model):
    """A device a release (or a preemption's move) freed, not yet offered to the pending claims it could serve.

    Insert-only on the release path (no row another release needs); the round's wake-up step
    (``scheduler.services.wakeups``) offers it to the first ``WAKE_FANOUT`` pending claims in the scheduler's
    order that it can serve (``woken``), the next ones once those were decided while it is still free, and
    drops it once it is in use again or no claim is left to offer it to."""

    id = models.BigAutoField(primary_key=True)
    cluster = models.CharField(max_length=63)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    device = models.CharField(max_length=63)
    # The claims it woke last: it is offered to the next ones only once these were decided.
    woken = models.JSONField(default=list, blank=True)


class UtilisationSnapshot(models.Model):
    """Devices in use per cluster and product at one moment (the dashboard charts these over time)."""

    taken_at = models.DateTimeField(db_index=True)
    cluster = models.CharField(max_length=63)
    driver = models.CharField(max_length=63)
    product = models.CharField(max_length=253, blank=True, default="")
    devices_total = models.IntegerField()
    devices_allocated = models.IntegerField()
    shares_allocated = models.IntegerField(default=0)

    class Meta:
        ordering = ["taken_at", "cluster", "driver", "product"]
        indexes = [models.Index(fields=["cluster", "taken_at"], name="claims_util_cluster")]


class AllocationRound(models.Model):
    """One allocation round of a worker, as ``/metrics`` reads it: the round-duration histogram and the
    allocation-error counts are computed from these rows at scrape time, so every web process reports the
    same numbers whichever worker process (or host) ran the round. Insert-only; rows older than the metrics
    window are purged hourly (``scheduler.services.round_log.purge``)."""

    finished_at = models.DateTimeField(db_index=True)
    seconds = models.FloatField()
    taken = models.IntegerField(default=0)
    allocated = models.IntegerField(default=0)
    pending = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    lost_race = models.IntegerField(default=0)
    # What a round costs beyond its own claims (issue 14's soak reads them): database rows read to bring the
    # devices in use up to date, and seconds in statements taking locks other workers may hold.
    rows_read = models.IntegerField(default=0)
    lock_seconds = models.FloatField(default=0.0)
    # The round raised (the exception still propagates to the task): an allocation error an operator must see.
    error = models.CharField(max_length=200, blank=True, default="")
