"""``GET …/resourceclaims/{name}/explain``: why a claim is where it is.

The worker stores the engine's diagnostics with every attempt, and re-attempts a pending claim whenever
something that may help it changes (a release of devices it waits for, or a change that wakes every claim:
``FleetState.version``, which ``attemptedVersion`` and ``fleetVersion`` count); ``current`` says whether
the stored account still stands. ``refresh`` runs the engine now on a throw-away copy (no write, nothing reserved).
"""
from __future__ import annotations

from claims.models import Phase, ResourceClaim
from claims.placement import claim_group
from claims.services import fleet, taking


def explain(claim: ResourceClaim, *, refresh: bool = False, queue: dict | None = None) -> dict:
    """``queue``: the claim's queue status fields with the start-time estimate (the door reads them from the
    queues app), or None."""
    version = taking.claims_version()
    out = {
        "claim": {"namespace": claim.namespace.name, "name": claim.name, "uid": str(claim.uid)},
        "phase": str(claim.phase), "reason": claim.reason, "message": claim.message,
        "cluster": claim.cluster or None, "node": claim.node or None,
        "attempts": claim.attempts,
        "lastAttemptTime": claim.last_attempt_at.strftime("%Y-%m-%dT%H:%M:%SZ") if claim.last_attempt_at else None,
        "fleetVersion": version, "attemptedVersion": claim.attempted_version,
        "current": claim.phase != Phase.PENDING or not taking.undecided_pending().filter(pk=claim.pk).exists(),
        "diagnostics": claim.diagnostics,
    }
    if queue:  # e.g. "position 3 in team-a; about 12 min: running claims ending by 14:11 free the 8 ..."
        words = [f"position {queue['positionInQueue']} in {queue['queue']}" if "positionInQueue" in queue
                 else f"queue {queue['queue']}"]
        estimate = queue.get("estimate") or {}
        if estimate.get("message"):
            words.append(estimate["message"])
        out["queue"] = {**queue, "summary": "; ".join(words)}
    if refresh and claim.phase == Phase.PENDING:
        out["diagnostics"] = dry_run(claim)
        out["current"] = True
        out["refreshed"] = True
    return out


def dry_run(claim: ResourceClaim) -> dict:
    """The engine's answer for this claim alone, now, against the current fleet and devices in use."""
    from dra.cel import REQUEST_COST_BUDGET, CostBudgetExhausted, CostMeter, metered
    from dra.engine import Engine

    view = fleet.current_view()
    engine = Engine(view.snapshot, list(fleet.rows_in_use().values()))
    try:
        # All CEL evaluations of the dry run share one budget (each also has its own, dra.cel's default).
        with metered(CostMeter(REQUEST_COST_BUDGET)):
            outcome = engine.allocate(claim_group([claim], view.cluster_labels, key=f"claim:{claim.uid}"),
                                     raise_errors=False)
    except CostBudgetExhausted as exc:
        return {"allocatable": False, "reason": "cel_budget_exhausted", "message": f"the dry run was stopped: "
                f"{exc.reason}", "cluster": None, "node": None, "diagnostics": None, "error": None}
    data = outcome.to_dict()
    return {"allocatable": outcome.allocated, "reason": data.get("reason"), "message": data.get("message"),
            "cluster": data.get("cluster"), "node": data.get("node"), "diagnostics": data.get("diagnostics"),
            "error": data.get("error")}
