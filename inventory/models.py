"""The fleet's ``resource.k8s.io/v1`` inventory, one row per Kubernetes object (plus flattened devices).

What a cluster pushes is kept as normalized v1 JSON (``ResourceSlice.object``, ``DeviceClass.object``,
``DeviceTaintRule.object``) so that reading an object back gives exactly what was stored. The other columns
are projections of that JSON for filtering and indexing; they are rewritten together with the JSON by
``inventory.services`` and never edited on their own.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class Cluster(models.Model):
    """A Kubernetes cluster whose agent pushes its DRA inventory."""

    # Set on the rows the dashboard lists (claims.services.figures.fleet): not columns, declared for mypy.
    stale_now: bool
    last_seen: datetime | None
    node_count: int
    devices_published: int

    name = models.CharField(max_length=63, unique=True)
    labels = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Freshness: the newest of the two decides whether the cluster's devices may be offered.
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Set by sweep_stale_clusters() when the cluster went silent; cleared by the next sync or heartbeat.
    stale_since = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=128, blank=True, default="")
    agent_status = models.JSONField(default=dict, blank=True)
    # Bumped by every inventory change so the allocation worker can tell "nothing changed" cheaply.
    inventory_version = models.BigIntegerField(default=0)
    # Bumped by every write of the cluster object itself (name/labels); the ETag.
    resource_version = models.BigIntegerField(default=1)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def last_seen_at(self):
        seen = [t for t in (self.last_sync_at, self.last_heartbeat_at) if t is not None]
        return max(seen) if seen else None

    def is_stale(self, now=None) -> bool:
        """Live staleness: silent for longer than settings.STALE_CLUSTER_SECONDS (or never heard from)."""
        seen = self.last_seen_at
        if seen is None:
            return True
        now = now or timezone.now()
        return now - seen > timedelta(seconds=settings.STALE_CLUSTER_SECONDS)

    @property
    def stale(self) -> bool:
        return self.is_stale()


class Node(models.Model):
    # Indexed by the (cluster, name) unique constraint; a separate FK index would only slow bulk writes.
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes", db_index=False)
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="inventory_node_unique")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.name}"


class ResourceSlice(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="resource_slices", db_index=False)
    name = models.CharField(max_length=253)
    driver = models.CharField(max_length=63)
    pool_name = models.CharField(max_length=253)
    pool_generation = models.BigIntegerField()
    resource_slice_count = models.BigIntegerField()
    # Exactly one of the four node-selection fields is set (validated before storing).
    node_name = models.CharField(max_length=253, blank=True, default="")
    node_selector = models.JSONField(null=True, blank=True)
    all_nodes = models.BooleanField(default=False)
    per_device_node_selection = models.BooleanField(default=False)
    device_count = models.IntegerField(default=0)
    object = models.JSONField()  # the normalized v1 ResourceSlice
    # SHA-256 of the canonical JSON of `object`: a periodic full push compares hashes, not documents, so an
    # unchanged slice costs nothing to re-push.
    content_hash = models.CharField(max_length=64)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="inventory_slice_unique")]
        indexes = [models.Index(fields=["cluster", "driver", "pool_name"], name="inventory_slice_pool")]

    def __str__(self) -> str:
        return self.name


class Pool(models.Model):
    """A pool is (cluster, driver, pool name); its state is recomputed from its slices on every change."""

    COMPLETE, INCOMPLETE, INVALID = "complete", "incomplete", "invalid"
    STATES = [(COMPLETE, "complete"), (INCOMPLETE, "incomplete"), (INVALID, "invalid")]

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools", db_index=False)
    driver = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    generation = models.BigIntegerField()  # the highest generation seen; only its slices count
    resource_slice_count = models.BigIntegerField()
    slice_count = models.IntegerField()  # slices present at `generation`
    device_count = models.IntegerField()  # devices in those slices
    state = models.CharField(max_length=16, choices=STATES)
    reason = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster_id", "driver", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "driver", "name"], name="inventory_pool_unique")]

    def __str__(self) -> str:
        return f"{self.driver}/{self.name}"


class PoolEvent(models.Model):
    """Something about a pool worth an operator's attention that the pool's own state does not keep, e.g. its
    generation going backwards (a driver reinstall restarts generations; the push is accepted as the
    cluster's truth, and recorded here). Keyed by names, not by the Pool row, so it outlives the pool."""

    GENERATION_REGRESSED = "GenerationRegressed"
    # A DeviceClass's (or a claim's) selector fails at run time on devices of the pool: they match nothing
    # (dra.engine.selectors). Raised by the allocation round, once per push (``key``).
    SELECTOR_ERROR = "SelectorError"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pool_events", db_index=False)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    type = models.CharField(max_length=64)
    message = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Deduplication: an event with a key is stored once per cluster (the raisers put the push in the key).
    key = models.CharField(max_length=64, null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["cluster", "driver", "pool", "id"], name="inventory_poolevent_pool")]
        constraints = [models.UniqueConstraint(fields=["cluster", "key"], condition=models.Q(key__isnull=False),
                                               name="inventory_poolevent_key")]

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}: {self.type}"


class Device(models.Model):
    """One device of one slice, flattened for filtering. Rewritten whenever its slice is."""

    # Covered by the inventory_device_key index, which starts with the cluster.
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="devices", db_index=False)
    resource_slice = models.ForeignKey(ResourceSlice, on_delete=models.CASCADE, related_name="devices")
    # Null for devices not bound to one node (allNodes / nodeSelector: network-attached).
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="devices")
    node_name = models.CharField(max_length=253, blank=True, default="")
    driver = models.CharField(max_length=63)
    pool_name = models.CharField(max_length=253)
    pool_generation = models.BigIntegerField()
    name = models.CharField(max_length=63)
    attributes = models.JSONField(default=dict)  # v1 form: {"productName": {"string": "..."}}
    capacity = models.JSONField(default=dict)  # v1 form: {"memory": {"value": "80Gi"}}
    consumes_counters = models.JSONField(default=list)
    taints = models.JSONField(default=list)
    allow_multiple_allocations = models.BooleanField(default=False)
    binds_to_node = models.BooleanField(default=False)
    binding_conditions = models.JSONField(default=list)
    binding_failure_conditions = models.JSONField(default=list)
    # Per-device node selection (perDeviceNodeSelection slices); inherited from the slice otherwise.
    all_nodes = models.BooleanField(default=False)
    node_selector = models.JSONField(null=True, blank=True)
    # Flattened, fully qualified, stringified attributes ({"gpu.nvidia.com/productName": "NVIDIA H100..."})
    # for `?attribute=name=value` equality filters. On PostgreSQL a GIN (jsonb_path_ops) index serves them;
    # it is created by migration 0002 only there, because SQLite (the embedded default) has no GIN.
    attribute_index = models.JSONField(default=dict)

    class Meta:
        ordering = ["cluster_id", "driver", "pool_name", "name"]
        indexes = [
            models.Index(fields=["cluster", "driver", "pool_name", "name"], name="inventory_device_key"),
            models.Index(fields=["cluster", "node_name"], name="inventory_device_node"),
            # The dashboard's search finds a device by name in any cluster.
            models.Index(fields=["name"], name="inventory_device_name"),
        ]

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool_name}/{self.name}"


class DeviceClass(models.Model):
    """A v1 DeviceClass. Fleet-wide (cluster null, admin-managed) or pushed by one cluster's agent."""

    # Set on the rows the dashboard lists (frontend.queries.inventory): not columns, declared for mypy.
    selectors: list[str]
    has_config: bool
    accelerator: bool
    matches: int | None

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, null=True, blank=True,
                                related_name="device_classes")
    name = models.CharField(max_length=253)
    object = models.JSONField()
    resource_version = models.BigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "cluster_id"]
        # NULL is distinct in a plain unique constraint, so fleet-wide names need their own partial one.
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="inventory_class_unique"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(cluster__isnull=True),
                                    name="inventory_class_fleet_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class DeviceTaintRule(models.Model):
    """A v1alpha3/v1 DeviceTaintRule. Fleet-wide (cluster null, admin-managed) or pushed by one cluster."""

    # Set on the rows the dashboard lists (frontend.queries.inventory): not columns, declared for mypy.
    taint: dict
    selector: dict | None
    selected: int | None
    annotations: dict

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, null=True, blank=True,
                                related_name="device_taint_rules")
    name = models.CharField(max_length=253)
    driver = models.CharField(max_length=63, blank=True, default="")
    pool_name = models.CharField(max_length=253, blank=True, default="")
    device_name = models.CharField(max_length=63, blank=True, default="")
    effect = models.CharField(max_length=32, blank=True, default="")
    object = models.JSONField()
    resource_version = models.BigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "cluster_id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="inventory_taintrule_unique"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(cluster__isnull=True),
                                    name="inventory_taintrule_fleet_unique"),
        ]

    def __str__(self) -> str:
        return self.name
