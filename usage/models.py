"""The usage ledger and the price table.

``UsageInterval`` is append-only accounting: one row per device (or share of a device) a claim held, opened in
the claims commit's transaction and closed in the release's (``usage.services.ledger``). Allocation rows and
claims are deleted when freed; these rows stay, so they carry everything a report groups by (namespace, queue,
cluster, node, product, sharing mode) as plain columns, not foreign keys.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q


class Sharing(models.TextChoices):
    EXCLUSIVE = "exclusive"  # a whole device: weight 1
    PARTITION = "partition"  # a partition (MIG) of a partitionable device: its share of the parent's memory
    SHARED = "shared"  # a share of an allowMultipleAllocations device: consumed / capacity


class UsageInterval(models.Model):
    """One device (or share) held by one claim from ``started_at`` to ``ended_at`` (null while held).

    ``weight`` is how much of one device the row counts for, fixed when the interval opens: device-hours are
    ``weight * (end - start)``. ``claim_id`` is the claim's id while it exists (no foreign key: the ledger
    outlives the claim); ``claim_uid`` identifies it for good.
    """

    claim_id = models.BigIntegerField()
    claim_uid = models.UUIDField()
    claim_name = models.CharField(max_length=253)
    namespace = models.CharField(max_length=63)
    queue = models.CharField(max_length=253, blank=True, default="")
    # db_default: raw inserts of the ledger (bulk SQL paths, tests) that predate the column still work
    reservation = models.CharField(max_length=63, blank=True, default="", db_default="")  # admitted through it
    cluster = models.CharField(max_length=63)
    node = models.CharField(max_length=253, blank=True, default="")
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    device = models.CharField(max_length=63)
    share_id = models.CharField(max_length=64, blank=True, default="")
    product = models.CharField(max_length=253, blank=True, default="")
    sharing = models.CharField(max_length=16, choices=Sharing.choices)
    weight = models.DecimalField(max_digits=16, decimal_places=12)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # Closing: the open intervals of the claims being released. Partial, so it stays small.
            models.Index(fields=["claim_id"], condition=Q(ended_at__isnull=True), name="usage_interval_open"),
            models.Index(fields=["started_at"], name="usage_interval_start"),
            models.Index(fields=["namespace", "started_at"], name="usage_interval_ns"),
            models.Index(fields=["cluster", "node", "started_at"], name="usage_interval_node"),
            models.Index(fields=["cluster", "device", "started_at"], name="usage_interval_device"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.claim_name} {self.cluster}/{self.driver}/{self.pool}/{self.device}"


class Price(models.Model):
    """The price of one device-hour of ``product``, on ``cluster`` or (blank) on every cluster; a
    cluster-specific price beats the product-wide one."""

    product = models.CharField(max_length=253)
    cluster = models.CharField(max_length=63, blank=True, default="")
    currency = models.CharField(max_length=3)
    per_device_hour = models.DecimalField(max_digits=18, decimal_places=6)
    resource_version = models.BigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["product", "cluster"], name="usage_price_unique")]

    def __str__(self) -> str:
        return f"{self.product}@{self.cluster or '*'}: {self.per_device_hour} {self.currency}"


class DecayedUsage(models.Model):
    """A queue's past use with a half-life (``usage.services.decay``): ``value`` device-seconds as of ``at``;
    read as ``value * 2^(-(now - at) / half_life_seconds)`` plus the queue's ``DecayedUsageDelta`` rows, each
    decayed from its own ``at``. One row per queue whose ``spec.fairSharing.halfLifeSeconds`` is above 0; the
    deltas are folded into it every few seconds (``decay.fold``)."""

    queue = models.CharField(max_length=253, unique=True)
    half_life_seconds = models.FloatField()
    value = models.FloatField(default=0.0)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]


class DecayedUsageDelta(models.Model):
    """Device-seconds that closed for a queue with a half-life, as of ``at``: written by the ledger's close in
    the release's statement. Insert-only, so that releases of one queue never wait for each other on its
    ``DecayedUsage`` row (an UPDATE held it to commit); ``decay.fold`` moves them into that row."""

    queue = models.CharField(max_length=253)
    value = models.FloatField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["queue"], name="usage_decay_delta_queue")]
