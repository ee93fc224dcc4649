from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imports here: the collector reads models, importable only once the registry is ready. The fleet
        # gauges live in this app because they are the dashboard's own unit counts (frontend.queries).
        from draservice.metrics import register_collector
        from frontend.metrics import FleetCollector

        register_collector("fleet", FleetCollector())
