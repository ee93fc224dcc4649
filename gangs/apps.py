from django.apps import AppConfig


class GangsConfig(AppConfig):
    name = "gangs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings

        from gangs.services import hold
        from gangs.tasks import SCHEDULE, on_inventory_changed
        from inventory.signals import inventory_changed

        hold.register()  # the claims round leaves member claims to the gang worker

        # Celery reads settings lazily, so filling the dict here reaches beat (as the claims app does).
        for name, entry in SCHEDULE.items():
            settings.CELERY_BEAT_SCHEDULE.setdefault(name, entry)
        inventory_changed.connect(on_inventory_changed, dispatch_uid="gangs.on_inventory_changed")
