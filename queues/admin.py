"""Django admin: queues are read here; the API (validation, ETags) writes them."""
from django.contrib import admin

from queues.models import Queue, QuotaCharge


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = ["name", "parent", "weight", "priority", "max_priority", "resource_version", "updated_at"]
    search_fields = ["name"]
    readonly_fields = ["uid", "resource_version", "spec", "parent", "weight", "priority", "max_priority"]

    def has_add_permission(self, request):
        return False


@admin.register(QuotaCharge)
class QuotaChargeAdmin(admin.ModelAdmin):
    list_display = ["queue", "claim", "device_class", "unit", "resource", "amount", "cluster"]
    list_filter = ["unit"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
