"""Django admin: a read-mostly window on the inventory (agents and the API write it)."""
from django.contrib import admin

from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node, Pool, ResourceSlice


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "labels", "last_sync_at", "last_heartbeat_at", "stale_since", "inventory_version"]
    search_fields = ["name"]
    readonly_fields = ["last_sync_at", "last_heartbeat_at", "stale_since", "inventory_version", "resource_version",
                       "agent_version", "agent_status"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["name", "cluster", "updated_at"]
    list_filter = ["cluster"]
    search_fields = ["name"]


@admin.register(ResourceSlice)
class ResourceSliceAdmin(ReadOnlyAdmin):
    list_display = ["name", "cluster", "driver", "pool_name", "pool_generation", "node_name", "device_count"]
    list_filter = ["cluster", "driver"]
    search_fields = ["name", "pool_name", "node_name"]


@admin.register(Pool)
class PoolAdmin(ReadOnlyAdmin):
    list_display = ["name", "cluster", "driver", "generation", "state", "reason"]
    list_filter = ["state", "cluster", "driver"]


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ["name", "cluster", "driver", "pool_name", "node_name"]
    list_filter = ["cluster", "driver"]
    search_fields = ["name", "pool_name", "node_name"]
    list_select_related = ["cluster"]


@admin.register(DeviceClass)
class DeviceClassAdmin(ReadOnlyAdmin):
    list_display = ["name", "cluster", "resource_version", "updated_at"]


@admin.register(DeviceTaintRule)
class DeviceTaintRuleAdmin(ReadOnlyAdmin):
    list_display = ["name", "cluster", "driver", "pool_name", "device_name", "effect"]
