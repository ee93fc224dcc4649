"""Defragmentation holds: a node freed by a defragmentation plan waits for the plan's target claim.

Applying a plan (``scheduler.services.defrag``) pins the target claim to the freed node and marks it with
``draservice.io/defrag-hold-until``. Until then, while the target is pending, a claims round does not give
that node's devices to any other group: a placement there is undone in the engine and the group waits
(``HeldForDefragmentation``), exactly as a queue head's reservation does. The hold ends when the target is
allocated, released or deleted, or at the time in the annotation (so a target that never fits cannot keep a
node idle for ever).
"""
from __future__ import annotations

import dataclasses
from datetime import datetime

from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.placement import node_pin
from draservice.prepared import PreparedValues

HOLD_UNTIL = "draservice.io/defrag-hold-until"
PLAN = "draservice.io/defrag-plan"
HELD_FOR_DEFRAG = "held_for_defragmentation"  # an engine outcome reason (the round maps it to a Reason)


class Screen:
    """A per-round filter of the engine's outcomes, in decision order: ``screen(group, outcome) -> outcome``
    undoes a placement on a node held for someone else and reports it held; ``avoid(group)`` names the
    (cluster, node) pairs held from ``group`` so far, for the engine to look elsewhere first."""

    def __call__(self, group, outcome):
        return outcome

    def avoid(self, group) -> frozenset[tuple[str, str]]:
        return frozenset()


def selector_set(engine, claims, cls: str):
    """The selector set of ``claims`` (a head's) for ``cls``: the class's selectors, plus its requests' own when
    every request of that class has the same ones (a node is held only where the head's devices are)."""
    klass = engine.get_class(None, cls)
    if klass is None:
        return None
    class_exprs = tuple(((s or {}).get("cel") or {}).get("expression", "")
                        for s in (klass.get("spec") or {}).get("selectors") or [])
    request_sets = {tuple(((s or {}).get("cel") or {}).get("expression", "") for s in exact.get("selectors") or [])
                    for c in claims for r in ((c.spec.get("devices") or {}).get("requests") or [])
                    if (exact := r.get("exactly")) and exact.get("deviceClassName") == cls}
    request_exprs = next(iter(request_sets)) if len(request_sets) == 1 else ()
    return engine.selector_set(cls, class_exprs, request_exprs)


def _until(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


# Every round asks (``round_screen``): compiled once (draservice.prepared).
_HOLDING = PreparedValues(lambda: ResourceClaim.objects.filter(phase=Phase.PENDING, annotations__has_key=HOLD_UNTIL)
                          .values_list("id", "annotations", "allowed_cluster_selector"))


def held_nodes(now=None) -> dict[tuple[str, str], int]:
    """(cluster, node) -> id of the pending claim holding it."""
    now = now or timezone.now()
    out: dict[tuple[str, str], int] = {}
    for claim_id, notes, selector in _HOLDING.rows():
        until, node = _until((notes or {}).get(HOLD_UNTIL)), node_pin(notes)
        cluster = (selector or {}).get("name")
        if until is not None and until > now and node and cluster:
            out.setdefault((cluster, node), claim_id)
    return out


class DefragScreen(Screen):
    """A placement on a held node by anyone but its holder is undone and reported as held; every other outcome
    goes to ``inner`` (the queues' screen). First, because it is the more specific reason: the target of a
    plan is often its queue's head too, holding the same node."""

    def __init__(self, engine, inner: Screen, held: dict[tuple[str, str], int]) -> None:
        self.engine, self.inner, self.held = engine, inner, held

    def avoid(self, group) -> frozenset[tuple[str, str]]:
        mine = {c.id for c in group.claims}
        return self.inner.avoid(group) | {where for where, holder in self.held.items() if holder not in mine}

    def __call__(self, group, outcome):
        if not outcome.allocated or not outcome.node:
            return self.inner(group, outcome)
        where = (outcome.cluster or "", outcome.node)
        holder = self.held.get(where)
        if holder is None or holder in {c.id for c in group.claims}:
            return self.inner(group, outcome)
        self.engine.release(outcome.devices)
        return dataclasses.replace(
            outcome, allocated=False, claims=[], devices=[], reason=HELD_FOR_DEFRAG,
            message=f"node {where[0]}/{where[1]} is held for a claim a defragmentation plan made room for; "
                    "waiting for room elsewhere", diagnostics={"heldFor": holder, "node": where[1],
                                                                "cluster": where[0]})


def round_screen(engine, inner: Screen) -> Screen:
    held = held_nodes()
    return DefragScreen(engine, inner, held) if held else inner
