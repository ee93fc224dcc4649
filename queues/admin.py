"""Django admin: queues are read here; the API (validation, ETags) writes them."""
from django.contrib import admin

from claims.services.taking import bump_fleet_version
from queues.models import Queue, QuotaCharge


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = ["name", "parent", "weight", "priority", "max_priority", "resource_version", "updated_at"]
    search_fields = ["name"]
    readonly_fields = ["uid", "resource_version", "spec", "parent", "weight", "priority", "max_priority"]

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # As every queue write does (queues.services.queues): claims are tried again, and the processes that keep
        # the queues they read at a fleet version (resolve.Tree.at) read them again.
        bump_fleet_version()


@admin.register(QuotaCharge)
class QuotaChargeAdmin(admin.ModelAdmin):
    list_display = ["queue", "claim", "device_class", "unit", "resource", "amount", "cluster"]
    list_filter = ["unit"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
