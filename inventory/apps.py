from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imports here: the collector reads models, importable only once the registry is ready.
        from draservice.metrics import register_collector
        from inventory.metrics import ClustersCollector

        register_collector("inventory", ClustersCollector())
