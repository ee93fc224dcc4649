from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imports here, not at the top: models and services may be imported only once the registry is ready.
        from claims import receivers
        from claims.metrics import ClaimsCollector
        from claims.services import device_states
        from claims.tasks import on_inventory_changed
        from draservice.metrics import register_collector
        from inventory import hooks
        from inventory.signals import inventory_changed

        inventory_changed.connect(on_inventory_changed, dispatch_uid="claims.on_inventory_changed")
        inventory_changed.connect(receivers.mark_removed_devices, dispatch_uid="claims.mark_removed_devices")
        # The inventory's device view shows (and filters by) what claims hold through these hooks.
        hooks.register_allocation_state_provider(device_states.allocation_states)
        hooks.register_allocation_state_filter(device_states.state_condition, device_states.STATES)
        register_collector("claims", ClaimsCollector())
