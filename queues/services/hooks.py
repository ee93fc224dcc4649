"""What the claims app asks the queues when a claim is written (``claims.services.queueing``), answered by this
app's services."""
from __future__ import annotations

from queues.services import cancellation, resolve


class QueueHooks:
    def check_new_claims(self, namespace: str, claims: list, unit: bool = False) -> list[tuple[str, str]]:
        return resolve.check_new_claims(namespace, claims, unit)

    def check_label_change(self, claim, labels: dict) -> list[tuple[str, str]]:
        return resolve.check_label_change(claim, labels)

    def preemptors_gone(self, claims: list, why: str) -> int:
        return cancellation.for_preemptors(claims, f"is gone ({why})")
