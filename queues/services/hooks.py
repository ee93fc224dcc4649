"""What the claims app asks the queues (``claims.services.queueing``), answered by this app's services."""
from __future__ import annotations

from queues.services import admission, order, reservation, resolve


class QueueHooks:
    def check_new_claims(self, namespace: str, claims: list, unit: bool = False) -> list[tuple[str, str]]:
        return resolve.check_new_claims(namespace, claims, unit)

    def check_label_change(self, claim, labels: dict) -> list[tuple[str, str]]:
        return resolve.check_label_change(claim, labels)

    def admit(self, units: list, view, now) -> dict:
        return admission.admit(units, view, now)

    def order(self, groups: list) -> list:
        return order.order(groups)

    def round_screen(self, engine):
        return reservation.round_screen(engine)

    def status(self, claims: list, estimate: bool = False, position: bool = True) -> dict[int, dict]:
        return order.positions(claims, estimate, position)
