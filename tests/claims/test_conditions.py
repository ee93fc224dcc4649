"""The condition table (``claims.services.conditions``): which condition states go with which phase, which
changes are allowed, and ``set_condition`` refusing a forbidden result when told the claim's phase. The first
rows are today's contradictions users see: ``Preempted=True`` beside ``Allocated=True`` once a requeued claim
is allocated again, and a Pending claim with ``QuotaReserved=True`` after a requeue."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from claims.models import Phase
from claims.services import conditions as c

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = datetime(2026, 1, 2, tzinfo=UTC)


def allocated_and_admitted() -> list:
    """An Allocated claim its queue admitted: what ``commit`` writes."""
    conds = c.set_allocated_condition([], False, "Created", "", NOW)
    conds = c.set_allocated_condition(conds, True, "Allocated", "allocated on c1/n1", NOW, phase=Phase.ALLOCATED)
    return c.set_condition(conds, c.QUOTA_RESERVED, True, "Admitted", "", NOW, phase=Phase.ALLOCATED)


def requeued() -> list:
    """What ``claims.services.preemption.requeue`` writes today (it does not name the phase)."""
    conds = c.set_allocated_condition(allocated_and_admitted(), False, c.PREEMPTED, "preempted", LATER)
    return c.set_condition(conds, c.PREEMPTED, True, c.PREEMPTED, "preempted", LATER)


def test_pending_with_quota_reserved_is_refused():
    refused = r"a claim in phase Pending may not have QuotaReserved=True \(Admitted\)"
    with pytest.raises(c.ForbiddenCondition, match=refused):
        c.set_allocated_condition(allocated_and_admitted(), False, c.PREEMPTED, "preempted", LATER,
                                  phase=Phase.PENDING)
    assert c.violations(Phase.PENDING, requeued()) == ["QuotaReserved=True (Admitted)"]


def test_preempted_beside_allocated_after_a_requeue_is_refused():
    refused = r"a claim in phase Allocated may not have Preempted=True \(Preempted\)"
    with pytest.raises(c.ForbiddenCondition, match=refused):
        c.set_allocated_condition(requeued(), True, "Allocated", "allocated on c1/n2", LATER, phase=Phase.ALLOCATED)
    # The notice before the deadline is no contradiction: the claim keeps its devices until then.
    notice = c.set_condition(allocated_and_admitted(), c.PREEMPTED, True, c.PREEMPTION_PENDING, "released at ...",
                             LATER, phase=Phase.ALLOCATED)
    assert c.violations(Phase.ALLOCATED, notice) == []


def test_consistent_results_pass_and_keep_their_transition_times():
    conds = allocated_and_admitted()
    assert c.violations(Phase.ALLOCATED, conds) == []
    again = c.set_allocated_condition(conds, True, "Allocated", "still", LATER, phase=Phase.ALLOCATED)
    assert [x["lastTransitionTime"] for x in again if x["type"] == c.ALLOCATED] == ["2026-01-01T00:00:00Z"]
    released = c.set_condition(c.set_allocated_condition(conds, False, "Released", "", LATER), c.RELEASED, True,
                               "Released", "", LATER, phase=Phase.RELEASED)
    assert c.violations(Phase.RELEASED, released) == []
    # Without a phase nothing is checked: the writers that do not name it yet behave as before.
    assert c.set_allocated_condition(conds, False, "x", "", LATER)[-1]["status"] == "False"


def test_forbidden_transitions():
    released = c.set_condition([], c.RELEASED, True, "Released", "", NOW)
    with pytest.raises(c.ForbiddenCondition, match="Released may not go from True to False"):
        c.set_condition(released, c.RELEASED, False, "Back", "", LATER)
    with pytest.raises(c.ForbiddenCondition, match="from Released to Pending"):
        c.check_transition(Phase.RELEASED, Phase.PENDING)
    c.check_transition(Phase.ALLOCATED, Phase.PENDING)  # a requeue
    c.check_transition(Phase.PENDING, Phase.ALLOCATED)


def test_the_table_names_every_phase():
    assert set(c.PHASE_CONDITIONS) == set(Phase.values)
    assert set(c.PHASE_TRANSITIONS) <= set(Phase.values)
