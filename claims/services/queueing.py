"""What the claims app asks the ``queues`` app when a claim is written: which queue it may name.

``queues`` sits above ``claims`` (it reads claims, namespaces and allocations), so claims may not import it;
it registers its checks here in ``AppConfig.ready`` instead, as gangs register their claims with
``external``. Without a registered provider every claim may be created.

The provider is asked, at write time only:
- ``check_new_claims(namespace, [(path, claim)], unit)`` at creation: field errors (a queue the namespace may not
  name, a priority over the queue's ``maxPriority``, mixed queues in one unit);
- ``check_label_change(claim, labels)`` when a claim's labels are replaced;
- ``preemptors_gone(claims, why)`` in the transaction that releases (or deletes) pending claims: the
  preemption notices they gave are cancelled there (their victims keep their devices);
- ``queue_status(claims, estimate, position, stamp)`` when the claims app's doors render a status: the queue
  fields;
- ``uncharge_sql()`` / ``uncharge(claim_ids)`` in the statement (PostgreSQL) or the transaction that frees
  claims' devices (``claims.services.claims.free_devices``): their quota charges end with their allocation, so
  the charges held are those of allocated claims and their sum needs no read of the claims.

Everything else about queues is asked from above, not through here: the scheduler orders its rounds, holds
nodes for queue heads and admits units between ``commit.verify`` and ``commit.write`` with the queues'
functions. The names below are the condition
types and reasons the claims app writes for them (``Verdict``: an admission's answer).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from claims.services import conditions

QUOTA_RESERVED = conditions.QUOTA_RESERVED
PREEMPTED = conditions.PREEMPTED
ADMITTED = "Admitted"
WAITING_FOR_QUOTA = "WaitingForQuota"
NO_QUOTA_FOR_CLASS = "NoQuotaForClass"
QUEUE_DOES_NOT_EXIST = "QueueDoesNotExist"


@dataclass(frozen=True)
class Verdict:
    reason: str  # WaitingForQuota | NoQuotaForClass | QueueDoesNotExist
    message: str
    queue: str = ""
    reservation: str = ""  # admitted through this reservation (not charged to the queue; the ledger says so)


class Provider(Protocol):
    def check_new_claims(self, namespace: str, claims: list[tuple[str, Any]],
                         unit: bool = False) -> list[tuple[str, str]]: ...

    def check_label_change(self, claim: Any, labels: dict) -> list[tuple[str, str]]: ...

    def preemptors_gone(self, claims: list[Any], why: str) -> int: ...

    def queue_status(self, claims: list[Any], estimate: bool, position: bool,
                     stamp: str | None = None) -> dict[int, dict]: ...

    def uncharge_sql(self) -> str: ...

    def uncharge(self, claim_ids: list[int]) -> None: ...


_provider: Provider | None = None


def register(provider: Provider) -> None:
    global _provider
    _provider = provider


def check_new_claims(namespace: str, claims: list[tuple[str, Any]], unit: bool = False) -> list[tuple[str, str]]:
    """``claims``: (field path, claim). ``unit``: they are allocated together (must share one queue)."""
    return _provider.check_new_claims(namespace, claims, unit) if _provider and claims else []


def check_label_change(claim: Any, labels: dict) -> list[tuple[str, str]]:
    """Field errors for new ``labels`` of an existing claim (a queue it may not use, a priority over the cap,
    another queue once it is admitted)."""
    return _provider.check_label_change(claim, labels) if _provider else []



def uncharge_sql() -> str:
    """A data-modifying WITH query (``uncharged``) ending the quota charges of the claims ``%(ids)s`` whose
    devices a statement frees (PostgreSQL); "" without a provider."""
    return _provider.uncharge_sql() if _provider else ""


def uncharge(claim_ids: list[int]) -> None:
    """``uncharge_sql`` elsewhere than on PostgreSQL, in the freeing transaction."""
    if _provider and claim_ids:
        _provider.uncharge(claim_ids)


def preemptors_gone(claims: list[Any], why: str) -> int:
    """In the releasing transaction: pending ``claims`` are released or deleted (``why``); cancel the preemption
    notices they gave. Returns how many."""
    return _provider.preemptors_gone(claims, why) if _provider and claims else 0


def queue_status(claims: list[Any], estimate: bool = False, position: bool = True,
                 stamp: str | None = None) -> dict[int, dict]:
    """claim id -> the queue fields of its status (queue, positionInQueue, the start-time estimate), for the
    claims app's doors to render; {} without a provider. ``stamp``: the fleet state's stamp (``FleetState``'s
    version, which every queue write moves, and the transaction that wrote it) read before this call: queues as
    they were then or later will do, so the provider may answer from what it read at that stamp (a claim's
    create answer: no read of the queues)."""
    return _provider.queue_status(claims, estimate, position, stamp) if _provider and claims else {}


# ``POST /api/v1/simulate`` against the stored fleet runs the scheduler's cycle after the engine (queue
# admission on a copy, where the claim would wait): registered by the scheduler (above this app) in
# ``SchedulerConfig.ready``; ``(claims, answer) -> answer``.
_simulation: Callable[[list[dict], dict], dict] | None = None


def register_simulation(step: Callable[[list[dict], dict], dict]) -> None:
    global _simulation
    _simulation = step


def simulated(claims: list[dict], answer: dict) -> dict:
    return _simulation(claims, answer) if _simulation is not None else answer
