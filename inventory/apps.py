from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings

        from inventory.tasks import beat_schedule

        # Celery reads settings lazily, so filling the dict here reaches beat.
        for name, entry in beat_schedule().items():
            settings.CELERY_BEAT_SCHEDULE.setdefault(name, entry)
