"""Read representations (camelCase, like Kubernetes) and the few write shapes the API accepts.

Kubernetes objects themselves (ResourceSlice, DeviceClass, DeviceTaintRule) are validated by
``dra.k8s.slices``, not by serializers: a serializer here only shapes rows for output or checks the small
non-Kubernetes inputs (a cluster's name and labels, a heartbeat).
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dra.k8s.fields import check_dns_label, check_label_name, check_label_value
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node, Pool, PoolEvent, ResourceSlice


def validate_labels(value) -> dict:
    if not isinstance(value, dict):
        raise serializers.ValidationError("must be an object of label names to label values")
    errors = []
    for key, val in value.items():
        errors += check_label_name(key, key) + check_label_value(val, key)
    if errors:
        raise serializers.ValidationError({path: [reason] for path, reason in errors})
    return value


class LabelsField(serializers.JSONField):
    def to_internal_value(self, data):
        return validate_labels(super().to_internal_value(data))


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class LabelsSchemaField(LabelsField):
    pass


class ClusterSerializer(serializers.ModelSerializer):
    labels = LabelsSchemaField(required=False, default=dict)
    stale = serializers.SerializerMethodField()
    # null until the cluster first syncs / sends a heartbeat / goes stale (allow_null: the schema says so)
    staleSince = serializers.DateTimeField(source="stale_since", read_only=True, allow_null=True)
    lastSyncAt = serializers.DateTimeField(source="last_sync_at", read_only=True, allow_null=True)
    lastHeartbeatAt = serializers.DateTimeField(source="last_heartbeat_at", read_only=True, allow_null=True)
    agentVersion = serializers.CharField(source="agent_version", read_only=True)
    agentStatus = serializers.JSONField(source="agent_status", read_only=True)
    inventoryVersion = serializers.IntegerField(source="inventory_version", read_only=True)
    resourceVersion = serializers.IntegerField(source="resource_version", read_only=True)
    nodeCount = serializers.IntegerField(source="node_count", read_only=True, default=None)
    deviceCount = serializers.IntegerField(source="device_count", read_only=True, default=None)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)

    class Meta:
        model = Cluster
        fields = ["id", "name", "labels", "stale", "staleSince", "lastSyncAt", "lastHeartbeatAt", "agentVersion",
                  "agentStatus", "inventoryVersion", "resourceVersion", "nodeCount", "deviceCount", "createdAt",
                  "updatedAt"]
        read_only_fields = ["id"]

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_stale(self, obj) -> bool:
        return obj.is_stale()

    def validate_name(self, value):
        errors = check_dns_label(value, "name")
        if errors:
            raise serializers.ValidationError(errors[0][1])
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError("a cluster cannot be renamed (its agents and claims refer to it)")
        return value


class ClusterCreatedSerializer(ClusterSerializer):
    token = serializers.CharField(read_only=True, help_text="The cluster's agent token; shown only this once.")

    class Meta(ClusterSerializer.Meta):
        fields = ClusterSerializer.Meta.fields + ["token"]


class HeartbeatSerializer(serializers.Serializer):
    agentVersion = serializers.CharField(required=False, allow_blank=True, max_length=128)
    status = serializers.JSONField(required=False, help_text="Free-form agent metrics, stored as given "
                                                             "(other top-level keys are stored too when absent).")


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    labels = LabelsSchemaField()
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "labels", "updatedAt"]


class ResourceSliceSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    pool = serializers.CharField(source="pool_name")
    poolGeneration = serializers.IntegerField(source="pool_generation")
    resourceSliceCount = serializers.IntegerField(source="resource_slice_count")
    nodeName = serializers.CharField(source="node_name")
    allNodes = serializers.BooleanField(source="all_nodes")
    perDeviceNodeSelection = serializers.BooleanField(source="per_device_node_selection")
    deviceCount = serializers.IntegerField(source="device_count")
    object = serializers.JSONField(help_text="The normalized resource.k8s.io/v1 ResourceSlice, as stored.")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        model = ResourceSlice
        fields = ["id", "cluster", "name", "driver", "pool", "poolGeneration", "resourceSliceCount", "nodeName",
                  "allNodes", "perDeviceNodeSelection", "deviceCount", "object", "updatedAt"]
        read_only_fields = fields


class PoolSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    resourceSliceCount = serializers.IntegerField(source="resource_slice_count")
    sliceCount = serializers.IntegerField(source="slice_count")
    deviceCount = serializers.IntegerField(source="device_count")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        model = Pool
        fields = ["id", "cluster", "driver", "name", "generation", "resourceSliceCount", "sliceCount",
                  "deviceCount", "state", "reason", "updatedAt"]
        read_only_fields = fields


TAINT_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "key": {"type": "string"}, "value": {"type": "string"}, "effect": {"type": "string"},
    "timeAdded": {"type": "string"},
    "source": {"type": "object", "description": "set on taints added by a DeviceTaintRule",
               "properties": {"kind": {"type": "string"}, "name": {"type": "string"}, "scope": {"type": "string"}}}},
    "additionalProperties": True}}
ALLOCATION_SCHEMA = {"type": "object", "properties": {
    "state": {"type": "string", "description": "free, allocated (one claim) or shared (several claims, or one "
                                                 "claim reserved for several consumers)"},
    "claimCount": {"type": "integer", "description": "claims holding the device, including those of "
                                                     "namespaces the caller may not read"},
    "claims": {"type": "array", "description": "holders in namespaces the caller may read",
               "items": {"type": "object", "properties": {
                   "namespace": {"type": "string"}, "name": {"type": "string"}, "request": {"type": "string"},
                   "shareID": {"type": "string"}}}}},
    "required": ["state"], "additionalProperties": True}


@extend_schema_field(TAINT_SCHEMA)
class TaintsField(serializers.JSONField):
    pass


class PoolEventSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    # DRF's serializer metaclass takes declared fields off the class: this does not shadow ``Serializer.data``.
    data = serializers.JSONField(read_only=True, allow_null=True)  # type: ignore[assignment]
    time = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = PoolEvent
        fields = ["id", "cluster", "driver", "pool", "type", "message", "data", "time"]
        read_only_fields = fields


class DeviceSerializer(serializers.ModelSerializer):
    """The flattened device view. ``taints``: the slice's own and those DeviceTaintRules add (with
    ``source``); ``allocation`` comes from inventory.hooks (the claims app fills it)."""

    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node = serializers.CharField(source="node_name")
    pool = serializers.CharField(source="pool_name")
    poolGeneration = serializers.IntegerField(source="pool_generation")
    poolState = serializers.CharField(source="pool_state", read_only=True, default=None, allow_null=True)
    resourceSlice = serializers.CharField(source="resource_slice.name", read_only=True)
    consumesCounters = serializers.JSONField(source="consumes_counters")
    taints = TaintsField()
    allowMultipleAllocations = serializers.BooleanField(source="allow_multiple_allocations")
    bindsToNode = serializers.BooleanField(source="binds_to_node")
    bindingConditions = serializers.JSONField(source="binding_conditions")
    bindingFailureConditions = serializers.JSONField(source="binding_failure_conditions")
    allNodes = serializers.BooleanField(source="all_nodes")
    nodeSelector = serializers.JSONField(source="node_selector")
    clusterStale = serializers.SerializerMethodField()
    allocation = serializers.SerializerMethodField()

    class Meta:
        model = Device
        fields = ["id", "cluster", "node", "driver", "pool", "name", "attributes", "capacity", "consumesCounters",
                  "taints", "allowMultipleAllocations", "bindsToNode", "bindingConditions",
                  "bindingFailureConditions", "allNodes", "nodeSelector", "resourceSlice", "poolGeneration",
                  "poolState", "clusterStale", "allocation"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_clusterStale(self, obj) -> bool:
        return obj.cluster.is_stale()

    def to_representation(self, obj):
        # Same output as the declared fields (which document the schema), built directly: listing a
        # 40,000-device cluster through DRF's per-field machinery costs several times more.
        return {
            "id": obj.pk, "cluster": obj.cluster.name, "node": obj.node_name, "driver": obj.driver,
            "pool": obj.pool_name, "name": obj.name, "attributes": obj.attributes, "capacity": obj.capacity,
            "consumesCounters": obj.consumes_counters, "taints": self.get_taints(obj),
            "allowMultipleAllocations": obj.allow_multiple_allocations, "bindsToNode": obj.binds_to_node,
            "bindingConditions": obj.binding_conditions, "bindingFailureConditions": obj.binding_failure_conditions,
            "allNodes": obj.all_nodes, "nodeSelector": obj.node_selector, "resourceSlice": obj.resource_slice.name,
            "poolGeneration": obj.pool_generation, "poolState": getattr(obj, "pool_state", None),
            "clusterStale": self.get_clusterStale(obj), "allocation": self.get_allocation(obj),
        }

    def get_taints(self, obj) -> list:
        added = (self.context.get("rule_taints") or {}).get(obj.pk)
        return list(obj.taints or []) + added if added else obj.taints

    @extend_schema_field(ALLOCATION_SCHEMA)
    def get_allocation(self, obj) -> dict:
        states = self.context.get("allocation_states") or {}
        return states.get(obj.pk) or {"state": "free"}


class KubeObjectRowSerializer(serializers.ModelSerializer):
    """DeviceClass / DeviceTaintRule rows: scope, cluster and the stored v1 object."""

    cluster = serializers.CharField(source="cluster.name", read_only=True, default=None, allow_null=True,
                                    help_text="the cluster that pushed it; null for a fleet-wide object")
    scope = serializers.SerializerMethodField()
    resourceVersion = serializers.IntegerField(source="resource_version", read_only=True)
    object = serializers.JSONField(read_only=True)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)

    @extend_schema_field({"type": "string", "enum": ["fleet", "cluster"]})
    def get_scope(self, obj) -> str:
        return "cluster" if obj.cluster_id else "fleet"


class DeviceClassSerializer(KubeObjectRowSerializer):
    class Meta:
        model = DeviceClass
        fields = ["id", "name", "scope", "cluster", "resourceVersion", "object", "createdAt", "updatedAt"]
        read_only_fields = fields


class DeviceTaintRuleSerializer(KubeObjectRowSerializer):
    device = serializers.CharField(source="device_name", read_only=True)
    pool = serializers.CharField(source="pool_name", read_only=True)

    class Meta:
        model = DeviceTaintRule
        fields = ["id", "name", "scope", "cluster", "driver", "pool", "device", "effect", "resourceVersion",
                  "object", "createdAt", "updatedAt"]
        read_only_fields = fields


class KubeObjectInputSerializer(serializers.Serializer):
    """Schema only: the body is a Kubernetes object (JSON or YAML), validated by dra.k8s.slices."""

    apiVersion = serializers.CharField(required=False)
    kind = serializers.CharField(required=False)
    metadata = serializers.JSONField()
    spec = serializers.JSONField()


class InventoryPushSerializer(serializers.Serializer):
    """Schema only: the full state of a cluster. A Kubernetes ``List`` with ``items`` is accepted too."""

    resourceSlices = serializers.ListField(child=serializers.JSONField(), required=False)
    nodes = serializers.ListField(child=serializers.JSONField(), required=False)
    deviceClasses = serializers.ListField(child=serializers.JSONField(), required=False)
    deviceTaintRules = serializers.ListField(child=serializers.JSONField(), required=False)


class SyncResultSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    inventoryVersion = serializers.IntegerField()
    changed = serializers.BooleanField()
    resourceSlices = serializers.DictField(child=serializers.IntegerField())
    nodes = serializers.DictField(child=serializers.IntegerField())
    deviceClasses = serializers.DictField(child=serializers.IntegerField())
    deviceTaintRules = serializers.DictField(child=serializers.IntegerField())
    devices = serializers.IntegerField()
    pools = serializers.DictField(child=serializers.IntegerField())
