from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from prometheus_client import REGISTRY

        from claims.services import queueing
        from queues.metrics import QueuesCollector
        from queues.services import hooks

        # The claims app asks queues through this registry (claims must not import queues: queues is above it).
        queueing.register(hooks.QueueHooks())
        if not getattr(REGISTRY, "_draservice_queues", False):
            REGISTRY.register(QueuesCollector())
            REGISTRY._draservice_queues = True
