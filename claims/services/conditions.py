"""Claim conditions, Kubernetes style: ``lastTransitionTime`` moves only when ``status`` changes.

The condition table says, as data, which condition states go with which phase (``PHASE_CONDITIONS``) and which
changes are allowed (``PHASE_TRANSITIONS``, ``CONDITION_TRANSITIONS``). ``set_condition`` refuses a forbidden
result (``ForbiddenCondition``) when its caller names the phase the claim will be in; ``violations`` lists what
a stored claim contradicts. A condition type a phase does not name may be in any state there (or absent).

A claim requeued by preemption gets ``QuotaReserved=False`` with ``Preempted=True`` (reason ``Preempted``), and
once allocated again ``Preempted=False`` (reason ``Readmitted``): ``Preempted=True`` goes with Allocated only
while a notice runs (``PreemptionPending``).
"""
from __future__ import annotations

from datetime import datetime

from claims.models import Phase

ALLOCATED = "Allocated"
RELEASED = "Released"
RELEASING = "Releasing"  # True: the claim is to be released, its devices held until that is confirmed
QUOTA_RESERVED = "QuotaReserved"
PREEMPTED = "Preempted"
PREEMPTION_PENDING = "PreemptionPending"  # Preempted=True while the claim still holds its devices (a notice)
READMITTED = "Readmitted"  # Preempted=False: requeued by preemption, then allocated again
PREEMPTION_CANCELLED = "PreemptionCancelled"  # Preempted=False: the notice was withdrawn, the devices kept

PENDING, ALLOCATED_PHASE, RELEASED_PHASE, FAILED = Phase.PENDING, Phase.ALLOCATED, Phase.RELEASED, Phase.FAILED
ANY = None  # any reason

# phase -> condition type -> {status: reasons allowed with it (ANY: every reason)}. A status not listed is
# forbidden in that phase.
PHASE_CONDITIONS: dict[str, dict[str, dict[str, frozenset[str] | None]]] = {
    PENDING: {
        ALLOCATED: {"False": ANY},
        RELEASED: {"False": ANY},
        QUOTA_RESERVED: {"False": ANY},  # quota is reserved only while the devices are held
    },
    ALLOCATED_PHASE: {
        ALLOCATED: {"True": ANY},
        RELEASED: {"False": ANY},
        # Marked for preemption, it keeps its devices until the deadline: the notice is the only True.
        PREEMPTED: {"True": frozenset({PREEMPTION_PENDING}), "False": ANY},
    },
    RELEASED_PHASE: {
        ALLOCATED: {"False": ANY},
        RELEASED: {"True": ANY},
    },
    FAILED: {
        ALLOCATED: {"False": ANY},
    },
}
# phase -> the phases a claim may move to from it (a claim is created Pending).
PHASE_TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING: frozenset({PENDING, ALLOCATED_PHASE, RELEASED_PHASE, FAILED}),
    ALLOCATED_PHASE: frozenset({ALLOCATED_PHASE, PENDING, RELEASED_PHASE}),  # Pending: requeued by preemption
    RELEASED_PHASE: frozenset({RELEASED_PHASE}),  # released is for good
}
# (type, old status, new status) changes that are never allowed.
CONDITION_TRANSITIONS_FORBIDDEN: frozenset[tuple[str, str, str]] = frozenset({
    (RELEASED, "True", "False"),  # a released claim is never unreleased
})


class ForbiddenCondition(ValueError):
    """A condition change the table forbids (a programming error: the writer contradicts the claim's phase)."""


def _ts(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list | None, type_: str, status: bool, reason: str, message: str,
                  now: datetime, *, phase: str | None = None) -> list:
    """``conditions`` with ``type_`` set. ``phase``: the phase the claim will be in; when given, a result the
    table forbids (for any condition, not only ``type_``) raises ``ForbiddenCondition``."""
    out = [dict(c) for c in conditions or [] if c.get("type") != type_]
    old = next((c for c in conditions or [] if c.get("type") == type_), None)
    status_s = "True" if status else "False"
    if old is not None and (type_, old.get("status"), status_s) in CONDITION_TRANSITIONS_FORBIDDEN:
        raise ForbiddenCondition(f"{type_} may not go from {old.get('status')} to {status_s}")
    changed = old is None or old.get("status") != status_s
    out.append({"type": type_, "status": status_s, "reason": reason, "message": message,
                "lastTransitionTime": _ts(now) if changed or old is None else old.get("lastTransitionTime", _ts(now))})
    if phase is not None:
        bad = violations(phase, out)
        if bad:
            raise ForbiddenCondition(f"a claim in phase {phase} may not have " + "; ".join(bad))
    return out


def set_allocated_condition(conditions, status: bool, reason: str, message: str, now: datetime, *,
                            phase: str | None = None) -> list:
    return set_condition(conditions, ALLOCATED, status, reason, message, now, phase=phase)


def violations(phase: str, conditions: list | None) -> list[str]:
    """The conditions that contradict ``phase`` (``type=status (reason)``), in the conditions' order."""
    rules = PHASE_CONDITIONS.get(phase, {})
    out = []
    for c in conditions or []:
        allowed = rules.get(c.get("type", ""))
        if allowed is None:
            continue
        status = c.get("status")
        reasons = allowed.get(status) if status in allowed else frozenset()
        if reasons is not ANY and c.get("reason") not in reasons:
            out.append(f"{c.get('type')}={status} ({c.get('reason')})")
    return out


def check_transition(old: str, new: str) -> None:
    """Refuse a phase change the table forbids."""
    allowed = PHASE_TRANSITIONS.get(old)
    if allowed is not None and new not in allowed:
        raise ForbiddenCondition(f"a claim may not go from {old} to {new}")


def is_true(conditions: list | None, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions or [])
