from django.apps import AppConfig


class GangsConfig(AppConfig):
    name = "gangs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from gangs.services import hold
        from gangs.tasks import on_inventory_changed
        from inventory.signals import inventory_changed

        hold.register()  # the claims round leaves member claims to the gang worker

        inventory_changed.connect(on_inventory_changed, dispatch_uid="gangs.on_inventory_changed")
