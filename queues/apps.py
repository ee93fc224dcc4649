from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from claims.services import queueing
        from draservice.metrics import register_collector
        from queues.metrics import QueuesCollector
        from queues.services import hooks

        # The claims app asks queues through this registry (claims must not import queues: queues is above it).
        queueing.register(hooks.QueueHooks())
        register_collector("queues", QueuesCollector())
