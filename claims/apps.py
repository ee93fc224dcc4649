from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings
        from prometheus_client import REGISTRY

        from claims.celery_schedule import SCHEDULE
        from claims.metrics import ClaimsCollector
        from claims.tasks import on_inventory_changed

        # Celery reads settings lazily, so filling the dict here reaches beat.
        for name, entry in SCHEDULE.items():
            settings.CELERY_BEAT_SCHEDULE.setdefault(name, entry)
        try:
            from inventory.signals import inventory_changed
        except ImportError:  # the inventory app always has it; keep the claims app importable on its own
            inventory_changed = None
        if inventory_changed is not None:
            inventory_changed.connect(on_inventory_changed, dispatch_uid="claims.on_inventory_changed")
        if not getattr(REGISTRY, "_draservice_claims", False):
            REGISTRY.register(ClaimsCollector())
            REGISTRY._draservice_claims = True
