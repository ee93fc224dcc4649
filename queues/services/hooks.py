"""What the claims app asks the queues when a claim is written or rendered (``claims.services.queueing``),
answered by this app's services."""
from __future__ import annotations

import copy

from queues import queues_sql
from queues.services import cancellation, order, reservations, resolve


class QueueHooks:
    def check_new_claims(self, namespace: str, claims: list, unit: bool = False) -> list[tuple[str, str]]:
        reservations.check_claims(namespace, claims)  # naming a reservation one may not use: 403
        return resolve.check_new_claims(namespace, claims, unit)

    def check_label_change(self, claim, labels: dict) -> list[tuple[str, str]]:
        reservations.check_claims(claim.namespace.name, [("", _relabelled(claim, labels))])
        return resolve.check_label_change(claim, labels)

    def preemptors_gone(self, claims: list, why: str) -> int:
        return cancellation.for_preemptors(claims, f"is gone ({why})")

    def queue_status(self, claims: list, estimate: bool, position: bool,
                     stamp: str | None = None) -> dict[int, dict]:
        return order.positions(claims, estimate, position, stamp)

    def uncharge_sql(self) -> str:
        return queues_sql.uncharge_cte()

    def uncharge(self, claim_ids: list[int]) -> None:
        queues_sql.delete_charges(claim_ids)


def _relabelled(claim, labels: dict):
    changed = copy.copy(claim)
    changed.labels = labels
    return changed
