"""Signals other apps connect to.

``inventory_changed`` is sent after the transaction that changed a cluster's inventory commits (never for a
rolled-back push), with ``cluster`` (name), ``cluster_id``, ``inventory_version`` and ``reason``
("sync", "slice", "node", "heartbeat-fresh", "stale", "deviceclass", "devicetainterule", "cluster").
The claims app connects to it to enqueue allocation.
"""
from django.db import transaction
from django.dispatch import Signal

inventory_changed = Signal()


def send_after_commit(*, cluster: str | None, cluster_id: int | None, inventory_version: int | None,
                      reason: str) -> None:
    def _send():
        inventory_changed.send(sender="inventory", cluster=cluster, cluster_id=cluster_id,
                               inventory_version=inventory_version, reason=reason)

    transaction.on_commit(_send)
