"""The change log: one row per change of a watched object, keyed by a global, monotonic sequence.

Written by database triggers (installed by each watched app's migrations; see ``draservice.changes``), so no
write path can forget it: the claims round, gangs, queues and the API all change claim rows, and every
such change lands here in the same transaction. Read by the Kubernetes front door's ``watch`` and list
``resourceVersion``; kept for ``CHANGES_RETENTION`` (older watches get 410 Gone).

Also the platform's API tokens (``APIToken``, issued by ``draservice.tokens``, verified by ``draservice.auth``).
"""
import hashlib
import uuid

from django.db import models
from django.utils import timezone


class Change(models.Model):
    seq = models.BigAutoField(primary_key=True)  # the resourceVersion of this change
    txid = models.BigIntegerField(default=0)  # the writer's PostgreSQL transaction id (gap detection)
    resource = models.CharField(max_length=63)  # e.g. "resourceclaims"
    namespace = models.CharField(max_length=63, blank=True, default="")
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=36)
    row_id = models.BigIntegerField()
    type = models.CharField(max_length=8)  # ADDED, MODIFIED, DELETED
    tombstone = models.JSONField(null=True, blank=True)  # the row as it was deleted (DELETED only)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["at"], name="draservice_change_at")]


class ChangeLogState(models.Model):
    """One row: how far the log is known settled, and how far it has been compacted."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    settled = models.BigIntegerField(default=0)  # every seq <= settled is committed or will never be
    compacted_through = models.BigIntegerField(default=0)  # rows with seq <= this may be gone
    # Entries of ``changes.ROW_RESOURCES`` (kept a shorter while) with seq <= this may be gone. Always <= settled.
    rows_compacted_through = models.BigIntegerField(default=0)
    pending_seq = models.BigIntegerField(default=0)  # the sequence's value when the horizon was taken
    pending_horizon = models.BigIntegerField(default=0)  # the next transaction id at that moment


class DeliveryStatus(models.TextChoices):
    PENDING = "Pending"  # waiting for its first attempt or a retry
    DELIVERED = "Delivered"
    FAILED = "Failed"  # given up: out of attempts, or an error no retry fixes (a redirect, a refused target)


class WebhookDelivery(models.Model):
    """One notice to one receiver, from its creation to its last attempt (``draservice.deliveries``).

    The URL, secret and body are captured when the notice is created: a retry goes where the first attempt
    went, with the same ``webhook-id`` and body, whatever the owner's webhook says by then."""

    message_id = models.CharField(max_length=64, unique=True)  # the webhook-id header
    event = models.CharField(max_length=64)  # e.g. "preemption.pending"
    owner = models.CharField(max_length=128)  # whose webhook, e.g. "queue/team-a"
    namespace = models.CharField(max_length=63, blank=True, default="")  # the tenant the notice is about
    url = models.TextField()
    secret = models.CharField(max_length=128)  # write-only: never rendered
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)  # an attempt is under way until then
    created_at = models.DateTimeField(auto_now_add=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["owner", "id"], name="draservice_delivery_owner"),
                   models.Index(fields=["next_attempt_at"], condition=models.Q(status="Pending"),
                                name="draservice_delivery_due")]


class WebhookEvent(models.Model):
    """Something about an owner's webhook worth telling its admin that no delivery shows, e.g. a signing
    secret the server generated for a webhook that had none."""

    owner = models.CharField(max_length=128)
    reason = models.CharField(max_length=64)
    message = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["owner", "id"], name="draservice_webhookevent_owner")]


class AuditEvent(models.Model):
    """One change of a policy object (a Queue, a Reservation, a Price, a fleet-wide DeviceClass or
    DeviceTaintRule): who made it, when, and what changed (``draservice.audit``). Written by the owning app's
    service in the transaction of the change, so a rolled-back write (a dry run, a failed check) leaves none."""

    at = models.DateTimeField()
    actor = models.CharField(max_length=160)  # "token:<name>", "user:<username>" or "system"
    actor_kind = models.CharField(max_length=16)  # the token's kind (admin, cluster, namespace), "user", "system"
    kind = models.CharField(max_length=63)  # e.g. "Queue"
    name = models.CharField(max_length=253)
    operation = models.CharField(max_length=16)  # Create, Update, Delete
    changes = models.JSONField(default=list)  # [{"path", "before", "after"}], leaves of the recorded fields

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["kind", "name", "id"], name="draservice_audit_object")]


class Versioned(models.Model):
    """An API object's identity and version: ``uid`` is fixed at creation, ``resource_version`` grows with every
    write (the services bump it under the row's lock). The ETag names both, so a re-created object (same name,
    new uid) never matches a tag of the one before."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    resource_version = models.BigIntegerField(default=1)

    class Meta:
        abstract = True

    @property
    def etag(self) -> str:
        return f'"{self.uid.hex}-{self.resource_version}"'


class APIToken(models.Model):
    """A bearer token. Only a prefix (for lookup) and the SHA-256 of the whole secret are stored.

    The secret is ``dra_<prefix>_<random>``; it is shown once, when issued (``draservice.tokens``). A cluster
    token names the cluster whose inventory it may push (a reference by name of model, so the platform imports
    no domain app). The table keeps its first name, ``inventory_apitoken``: tokens issued before the model moved
    here keep working.
    """

    ADMIN, CLUSTER, NAMESPACE = "admin", "cluster", "namespace"
    KINDS = [(ADMIN, "admin"), (CLUSTER, "cluster"), (NAMESPACE, "namespace")]

    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=KINDS)
    cluster = models.ForeignKey("inventory.Cluster", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="tokens")
    namespaces = models.JSONField(default=list, blank=True)
    read_only = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "inventory_apitoken"
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(kind="cluster", cluster__isnull=False) | ~models.Q(kind="cluster")),
                name="inventory_token_cluster_has_cluster",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode("utf-8")).hexdigest()

    def is_expired(self, now=None) -> bool:
        return self.expires_at is not None and (now or timezone.now()) >= self.expires_at

    @property
    def is_admin(self) -> bool:
        return self.kind == self.ADMIN
