"""The engine's diagnostics for a pending claim, told to a person.

The engine (``dra.engine.diagnostics``) charges every device it looked at to the first check it failed, per
request, and counts a "nearest miss" per request selector. Here that becomes a funnel (how many devices were
left after each check), the verdict in one sentence, the nodes that came closest, and what would help.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The engine's stage order, with words for people. (stage, label, advice when this stage is the bottleneck)
STAGES = [
    ("cluster_stale", "in clusters whose inventory is stale", "the cluster's agent has not synced recently"),
    ("pool_incomplete", "in pools still being published (incomplete)", "wait for the driver to publish all slices"),
    ("pool_invalid", "in invalid pools", "fix the driver's ResourceSlices (see Pools)"),
    ("node_mismatch", "not reachable from the node", ""),
    ("class_selector", "not of the requested DeviceClass", ""),
    ("request_selector", "rejected by the claim's own selectors", "relax a selector (see the nearest miss below)"),
    ("cel_error", "where a selector failed with a CEL error", "fix the selector"),
    ("binding_conditions_unsupported", "needing binding conditions (feature off)", ""),
    ("counters_unsupported", "partitions (partitionable devices feature off)", ""),
    ("allocated", "already allocated to other claims", "wait for claims to be released, or ask for fewer devices"),
    ("capacity", "without enough shareable capacity left", "ask for a smaller share"),
    ("counters", "partitions that no longer fit their GPU (counters used up)", "choose a smaller partition profile"),
    ("taint", "tainted, and the claim does not tolerate the taint", "add a toleration, or untaint the device"),
]
STAGE_LABEL = {s: label for s, label, _ in STAGES}

REASONS = {
    "unsatisfiable": "No node in the fleet can hold this claim right now.",
    "search_budget_exceeded": "The allocator gave up searching before it found a placement (search budget).",
    "no_eligible_cluster": "No cluster is eligible: the placement hints or staleness leave nothing to try.",
    "invalid_pools": "The only candidate devices are in invalid pools.",
    "selector_error_on_all_candidates": "The selectors fail on the only candidate devices (CEL runtime error, "
                                        "e.g. a missing attribute); it waits for the inventory to change.",
}


@dataclass
class FunnelStep:
    label: str
    dropped: int
    remaining: int
    width: float  # percent of considered, for the bar


@dataclass
class RequestExplanation:
    claim: str
    request: str
    device_class: str
    mode: str
    count: int | None
    considered: int
    available: int
    funnel: list[FunnelStep] = field(default_factory=list)
    best_nodes: list[dict] = field(default_factory=list)
    nearest_miss: list[dict] = field(default_factory=list)
    verdict: str = ""
    advice: list[str] = field(default_factory=list)
    engine_summary: str = ""


@dataclass
class Explanation:
    headline: str
    reason: str = ""
    requests: list[RequestExplanation] = field(default_factory=list)
    clusters: list[dict] = field(default_factory=list)
    nodes_examined: int = 0
    errors: list[str] = field(default_factory=list)
    summary: str = ""
    attempted: bool = True


def _diagnostics(claim) -> dict | None:
    diag = claim.diagnostics
    if not isinstance(diag, dict):
        return None
    # Accept the whole GroupOutcome.to_dict() as well as its ``diagnostics`` member.
    if "requests" not in diag and isinstance(diag.get("diagnostics"), dict):
        diag = {**diag["diagnostics"], "reason": diag.get("reason") or diag["diagnostics"].get("reason"),
                "message": diag.get("message", "")}
    return diag


# Checks a device meets before the selectors are even asked, the selectors themselves, and what can take a
# matching device away (in use, no room left, tainted). The verdict depends on which group ran dry.
PRE_SELECTOR = ("cluster_stale", "pool_incomplete", "pool_invalid", "node_mismatch")
SELECTOR = ("class_selector", "request_selector", "cel_error")


def explain_request(entry: dict) -> RequestExplanation:
    considered = int(entry.get("considered") or 0)
    dropped = {k: int(v or 0) for k, v in (entry.get("dropped") or {}).items()}
    r = RequestExplanation(
        claim=entry.get("claim", ""), request=entry.get("request", ""), device_class=entry.get("deviceClassName", ""),
        mode=entry.get("allocationMode", "ExactCount"), count=entry.get("count"), considered=considered,
        available=int(entry.get("available") or 0), best_nodes=list(entry.get("best_nodes") or []),
        nearest_miss=[m for m in entry.get("nearest_miss") or [] if m.get("would_match")],
        engine_summary=entry.get("summary", ""))
    remaining = considered
    for stage, label, _ in STAGES:
        n = dropped.get(stage, 0)
        if n:
            remaining -= n
            r.funnel.append(FunnelStep(f"{n:,} {label}", n, remaining,
                                       100.0 * remaining / considered if considered else 0))
    # An explanation cut by the engine's budget (``dra.engine.explain_walk``) says how many devices it left out.
    left = int(entry.get("not_examined") or 0)
    if left:
        remaining -= left
        r.funnel.append(FunnelStep(f"{left:,} not examined (the explanation's budget ran out: these counts are "
                                   "partial)", left, remaining, 100.0 * remaining / considered if considered else 0))
    matching = considered - sum(dropped.get(s, 0) for s in PRE_SELECTOR + SELECTOR)
    taken = [(dropped[s], s) for s, _, _ in STAGES if s not in PRE_SELECTOR + SELECTOR and dropped.get(s)]
    need = r.count
    best = r.best_nodes[0] if r.best_nodes else None
    if need is not None and r.available >= need:
        if best and best.get("available", 0) < need:
            r.verdict = (f"{r.available:,} matching devices are free, but they are spread out: at most "
                         f"{best['available']} on one node ({best['node']}), and this claim needs {need} together.")
            r.advice.append("free devices on one node (see Fragmentation), or ask for fewer devices per claim")
        else:
            r.verdict = (f"{r.available:,} matching devices are free and {need} are needed, but they cannot be "
                         "combined: a constraint (e.g. matchAttribute) or another request of the same consumer "
                         "rules every combination out.")
            r.advice.append("check the claim's constraints and the consumer's other claims")
    elif need is not None and matching < need:
        r.verdict = (f"Only {matching:,} device{'s' if matching != 1 else ''} in the fleet match the selectors of "
                     f"this request, and it needs {need}." if matching else
                     "No device in the fleet matches the selectors of this request.")
        r.advice.append("relax the selectors, or use a DeviceClass the fleet has devices for")
        if dropped.get("cluster_stale"):
            r.advice.append(f"{dropped['cluster_stale']:,} devices sit in stale clusters and were not considered; "
                            "they come back when those agents sync")
    else:
        why = ", ".join(f"{n:,} {STAGE_LABEL[s]}" for n, s in sorted(taken, reverse=True)) or "none is free"
        r.verdict = (f"{matching:,} devices match, but only {r.available:,} can be used ({why}); this request "
                     f"needs {need if need is not None else 'all of them'}.")
        for _, stage in sorted(taken, reverse=True)[:2]:
            advice = next(a for s, _, a in STAGES if s == stage)
            if advice:
                r.advice.append(advice)
    if left:
        r.verdict += f" (In part: {left:,} devices were not examined.)"
    if r.nearest_miss:  # the nearest miss itself is shown above the advice; point at it, do not repeat it
        best = max(r.nearest_miss, key=lambda m: m["would_match"])
        r.advice.append(f"selector #{best['selector']} is the one holding it back (see the nearest miss)")
    return r


def explain(claim) -> Explanation:
    diag = _diagnostics(claim)
    if not diag:
        return Explanation(headline="The allocator has not tried this claim yet." if claim.attempts == 0 else
                           (claim.message or "No diagnostics were recorded for the last attempt."),
                           reason=claim.reason, attempted=claim.attempts > 0)
    if isinstance(diag.get("error"), dict):  # the claim itself is wrong (unknown class, CEL error, limits)
        err = diag["error"]
        where = f" (field {err['field']})" if err.get("field") else ""
        return Explanation(headline=f"The claim cannot be allocated as written: {err.get('message', '')}{where}",
                           reason=err.get("code", claim.reason), errors=[])
    reason = diag.get("reason") or claim.reason or ""
    exp = Explanation(
        headline=REASONS.get(reason, claim.message or diag.get("message") or "The claim could not be allocated."),
        reason=reason, requests=[explain_request(e) for e in diag.get("requests") or []],
        clusters=list(diag.get("clusters") or []), nodes_examined=int(diag.get("nodes_examined") or 0),
        errors=list(diag.get("errors") or []), summary=diag.get("summary", ""))
    if claim.phase == "Failed" and not exp.requests:
        exp.headline = claim.message or exp.headline
    return exp
