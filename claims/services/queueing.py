"""The claims app's door to queue admission (quota, fair share, priority), which the ``queues`` app provides.

``queues`` sits above ``claims`` (it reads claims, namespaces and allocations), so claims may not import it;
it registers its hooks here in ``AppConfig.ready`` instead, as gangs register their claims with
``external``. Without a registered provider every unit is admitted, in arrival order (the behaviour before
queues).

The provider is asked:
- ``check_new_claims(namespace, [(path, claim)], unit)`` at creation: field errors (a queue the namespace may not
  name, a priority over the queue's ``maxPriority``, mixed queues in one unit);
- ``check_label_change(claim, labels)`` when a claim's labels are replaced;
- ``admit(units, view, now)`` by ``commit`` inside the commit transaction, after the race checks: which units are
  refused and why (``Verdict``); admitted units' quota is charged in the same transaction;
- ``order(groups)`` by the claims round, before the engine: the order in which the taken groups are tried;
- ``round_screen(engine)`` by the claims round: a per-round filter of the engine's outcomes (reservations);
- ``status(claims)`` by the renderers: extra ``status`` fields (queue, positionInQueue, estimate).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

QUOTA_RESERVED = "QuotaReserved"
PREEMPTED = "Preempted"
ADMITTED = "Admitted"
WAITING_FOR_QUOTA = "WaitingForQuota"
NO_QUOTA_FOR_CLASS = "NoQuotaForClass"
QUEUE_DOES_NOT_EXIST = "QueueDoesNotExist"
HELD_FOR_QUEUE_HEAD = "held_for_queue_head"  # an engine outcome reason (the round maps it to HeldForQueueHead)


@dataclass(frozen=True)
class Verdict:
    reason: str  # WaitingForQuota | NoQuotaForClass | QueueDoesNotExist
    message: str
    queue: str = ""


class Provider(Protocol):
    def check_new_claims(self, namespace: str, claims: list[tuple[str, Any]],
                         unit: bool = False) -> list[tuple[str, str]]: ...

    def check_label_change(self, claim: Any, labels: dict) -> list[tuple[str, str]]: ...

    def admit(self, units: list, view, now) -> dict[int, Verdict]: ...

    def order(self, groups: list) -> list: ...

    def status(self, claims: list, estimate: bool = False, position: bool = True) -> dict[int, dict]: ...

    def round_screen(self, engine) -> Any: ...


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


def admit(units: list, view, now) -> dict[int, Verdict]:
    """A verdict per index of ``units`` (claims.services.commit.Unit): ``ADMITTED`` (its quota is charged in
    the caller's transaction) or why not; ``view``: the fleet view the units were placed on."""
    return _provider.admit(units, view, now) if _provider and units else {}


def order(groups: list) -> list:
    return _provider.order(groups) if _provider and len(groups) > 1 else groups


class Screen:
    """A per-round filter of the engine's outcomes, in decision order: ``screen(group, outcome) -> outcome``
    undoes a placement on a node held for someone else and reports it held; ``avoid(group)`` names the
    (cluster, node) pairs held from ``group`` so far, for the engine to look elsewhere first."""

    def __call__(self, group, outcome):
        return outcome

    def avoid(self, group) -> frozenset[tuple[str, str]]:
        return frozenset()


def round_screen(engine) -> Screen:
    """The round's ``Screen`` (head-of-queue reservations: a placement on a node held for a queue's head is
    undone and reported as held)."""
    return _provider.round_screen(engine) if _provider else Screen()


def status(claims: list, estimate: bool = False, position: bool = True) -> dict[int, dict]:
    """Queue fields of ``claims``' status; ``estimate``: also the start-time estimate (costlier: a single
    claim's read asks for it, lists and create answers do not); ``position``: also ``positionInQueue``
    (a window over the queue's pending claims: reads ask for it, create answers do not -- a claim just
    created joins its queue's tail, and ranking the whole queue on every POST made submission cost grow
    with the queue)."""
    return _provider.status(claims, estimate, position) if _provider and claims else {}
