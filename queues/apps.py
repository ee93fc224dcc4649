from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings
        from prometheus_client import REGISTRY

        from claims.services import queueing
        from queues.metrics import QueuesCollector
        from queues.services import hooks
        from queues.tasks import SCHEDULE

        # The claims app asks queues through this registry (claims must not import queues: queues is above it).
        queueing.register(hooks.QueueHooks())
        # Celery reads settings lazily, so filling the dict here reaches beat (as the claims app does).
        for name, entry in SCHEDULE.items():
            settings.CELERY_BEAT_SCHEDULE.setdefault(name, entry)
        if not getattr(REGISTRY, "_draservice_queues", False):
            REGISTRY.register(QueuesCollector())
            REGISTRY._draservice_queues = True
