"""Gangs: all-or-nothing groups of consumers (KAI Scheduler's PodGroup), placed inside one topology domain.

A ``Gang`` lives in a namespace (a ``claims.Namespace``) and has members; each member is one
``claims.Consumer`` (a pod, a worker) with its ResourceClaims, made by ``gangs.services.gangs`` from the
gang's spec. The gang worker (``scheduler.services.gang_placement``) allocates at least ``min_member``
members, each with all of its claims, in ONE transaction, or writes nothing.

Member claims are kept away from the claims app's per-claim allocation round (which would place them one
by one and break all-or-nothing) through the round's hook for other allocators: see ``gangs.services.hold``.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from draservice.models import Versioned


class GangPhase(models.TextChoices):
    PENDING = "Pending"  # nothing held; waiting until one domain can take at least minMember members
    PLACED = "Placed"  # at least minMember members hold all their claims
    FAILED = "Failed"  # timed out, lost members below minMember, or invalid: everything released
    RELEASED = "Released"  # released by its owner: everything released


class Gang(Versioned):
    # Set on the rows the dashboard lists (gangs.dashboard): not columns, declared for mypy.
    domain_values: list[str]

    namespace = models.ForeignKey("claims.Namespace", on_delete=models.PROTECT, related_name="gangs")
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField()  # normalized: minMember, scheduleTimeoutSeconds, topology, members, placement
    min_member = models.IntegerField()
    member_count = models.IntegerField()
    schedule_timeout_seconds = models.IntegerField(null=True, blank=True)

    phase = models.CharField(max_length=16, choices=GangPhase.choices, default=GangPhase.PENDING)
    reason = models.CharField(max_length=64, blank=True, default="")  # machine-readable, CamelCase
    message = models.TextField(blank=True, default="")
    conditions = models.JSONField(default=list, blank=True)
    placed_count = models.IntegerField(default=0)
    # Members with usable claims that are not placed yet. A placed gang with some left keeps trying to add
    # them inside its domain (members beyond minMember are best effort, as in KAI).
    waiting_count = models.IntegerField(default=0)
    cluster = models.CharField(max_length=63, blank=True, default="")
    domain = models.JSONField(default=dict, blank=True)  # required level and wider: {label: value}
    preferred_domains = models.JSONField(default=list, blank=True)  # [{"domain": {...}, "members": n}]
    diagnostics = models.JSONField(null=True, blank=True)  # the placer's account of the last attempt
    attempts = models.IntegerField(default=0)
    # The claims app's fleet version (taking.fleet_version) at the last unsuccessful attempt: the placement is
    # deterministic, so it is not retried until devices were freed or the inventory changed (as for claims).
    attempted_version = models.BigIntegerField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set while a worker decides this gang (``scheduler.services.gang_placement``); others skip it until then.
    taken_until = models.DateTimeField(null=True, blank=True)
    taken_by = models.IntegerField(null=True, blank=True)  # the taking worker's PostgreSQL backend pid
    # A pending gang at the head of its queue holds the nodes its members need (``scheduler.services.gang_holds``):
    # the queue it holds them for, and [[cluster, node], ...]. Read by the claims round only while Pending.
    hold_queue = models.CharField(max_length=253, blank=True, default="")
    held_nodes = models.JSONField(default=list, blank=True)
    hold_need = models.JSONField(default=dict, blank=True)  # {device class: devices} the members need in all

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deadline = models.DateTimeField(null=True, blank=True)  # created_at + scheduleTimeoutSeconds
    placed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="gangs_gang_unique_name")]
        indexes = [
            models.Index(fields=["id"], condition=Q(phase="Pending"), name="gangs_gang_pending"),
            models.Index(fields=["deadline"], condition=Q(phase="Pending"), name="gangs_gang_deadline"),
            models.Index(fields=["id"], condition=Q(phase="Placed"), name="gangs_gang_placed"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}/{self.name}"

    @property
    def topology(self) -> dict:
        return self.spec.get("topology") or {}

    def in_level_order(self, labels: dict | None) -> dict:
        """``labels`` ordered widest level first (PostgreSQL's jsonb does not keep key order)."""
        levels = self.topology.get("levels") or []
        labels = labels or {}
        return {level: labels[level] for level in levels if level in labels}


class MemberPhase(models.TextChoices):
    PENDING = "Pending"
    PLACED = "Placed"
    LOST = "Lost"  # a claim was released or deleted outside the gang, or the consumer was deleted
    RELEASED = "Released"


class GangMember(models.Model):
    gang = models.ForeignKey(Gang, on_delete=models.CASCADE, related_name="members")
    name = models.CharField(max_length=63)
    index = models.IntegerField()
    # The member's consumer (claims app). Deleting the consumer through the claims API loses the member.
    consumer = models.OneToOneField("claims.Consumer", on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="gang_member")
    phase = models.CharField(max_length=16, choices=MemberPhase.choices, default=MemberPhase.PENDING)
    cluster = models.CharField(max_length=63, blank=True, default="")
    node = models.CharField(max_length=253, blank=True, default="")
    labels = models.JSONField(default=dict, blank=True)  # the node's topology labels
    placed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["gang_id", "index"]
        constraints = [models.UniqueConstraint(fields=["gang", "name"], name="gangs_member_unique_name")]


class GangEvent(models.Model):
    """The gang's audit trail (its claims keep their own in ``claims.ClaimEvent``)."""

    gang = models.ForeignKey(Gang, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    namespace = models.CharField(max_length=63)
    gang_name = models.CharField(max_length=253)
    gang_uid = models.UUIDField()
    type = models.CharField(max_length=32)  # Created, PlacementAttempt, Placed, Failed, Released, Deleted
    reason = models.CharField(max_length=64, blank=True, default="")
    message = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["gang_uid", "id"], name="gangs_event_gang")]
