"""Django admin: the platform's API tokens (issued with ``manage.py create_token`` or by registering a cluster)."""
from django.contrib import admin

from draservice.models import APIToken


@admin.register(APIToken)
class APITokenAdmin(admin.ModelAdmin):
    # Tokens are issued with `manage.py create_token` or by registering a cluster: the secret is never here.
    list_display = ["name", "kind", "cluster", "namespaces", "read_only", "expires_at", "last_used_at"]
    list_filter = ["kind", "read_only"]
    readonly_fields = ["prefix", "secret_hash", "kind", "cluster", "created_at", "last_used_at"]

    def has_add_permission(self, request):
        return False
