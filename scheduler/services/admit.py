"""The scheduler's commit step: verify, admit, write -- in the caller's transaction, in that order.

The claims app verifies that what the decision relied on still holds (``claims.services.commit.verify``, under
locks held to commit); the queues' quota admits the units still live, on what the engine actually placed
(``queues.services.admission``: admitted units' quota is charged in this transaction); the claims app writes
the admitted ones (``claims.services.commit.write``). Quota is decided here and only here: a unit placed
through a reservation inside its window is admitted by it and charged to no queue (``scheduler.services
.reservations.admit``). The preemption notices of claims it allocated are cancelled in the same transaction
(``queues.services.cancellation``).
"""
from __future__ import annotations

from claims.services import commit as claim_commit
from queues.services import admission, cancellation
from scheduler.services import reservations


def commit(units: list[claim_commit.Unit], view, rows_seen, now) -> claim_commit.CommitResult:
    lost = claim_commit.verify(units, view, rows_seen)
    live = [i for i in range(len(units)) if i not in lost]
    booked = reservations.admit({i: units[i] for i in live}, view)
    live = [i for i in live if i not in booked]
    live_units = [units[i] for i in live]
    verdicts = {live[j]: v for j, v in (admission.admit(live_units, view, now) if live_units else {}).items()}
    verdicts.update(booked)
    result = claim_commit.write(units, view, now, lost, verdicts)
    # A preemptor allocated (on room freed elsewhere) no longer needs the devices its notices claim.
    cancellation.for_preemptors(result.allocated, "was allocated", now)
    return result
