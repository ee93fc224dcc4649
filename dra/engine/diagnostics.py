"""Why a group could not be placed: structured counts per request, per cluster and per node, and a nearest miss.

Runs only after a failure. For each request (and each ``firstAvailable`` alternative) every device of the eligible
clusters is charged to the first check it fails, in this order:

    cluster_stale, pool_incomplete, pool_invalid, node_mismatch, class_selector, request_selector, cel_error,
    binding_conditions_unsupported, counters_unsupported, allocated, capacity, counters, taint

Devices that pass all of them are ``available``: they could serve the request on their own, so the failure is
about combining them (not enough on one node, a constraint, other requests of the group). ``nearest_miss``
counts, for each request selector, the devices that would match if that one selector were dropped.

The cost does not grow with the fleet for the selectors: they are evaluated once per group of devices they
cannot tell apart (``explain_walk``). The per-device checks have a budget per explanation; past it the
devices left are ``not_examined`` and the explanation and its requests say ``"sampled": true``.
"""
from __future__ import annotations

from collections import Counter

from .explain_walk import ExplainBudget, stale_counts
from .types import Reason

STAGES = ("cluster_stale", "pool_incomplete", "pool_invalid", "node_mismatch", "class_selector", "request_selector",
          "cel_error", "binding_conditions_unsupported", "counters_unsupported", "allocated", "capacity", "counters",
          "taint")

MAX_NODES_LISTED = 20
# Nodes (or "(network)") with the most available devices listed per request; the claims service's wake-ups
# read a node not listed as having at most the last count listed.
BEST_NODES_LISTED = 5
MAX_ERRORS_LISTED = 10


def explain(engine, group, clusters, plans, skipped, node_log, node_errors, budget, reason) -> dict:
    requests: dict[tuple, dict] = {}
    spend = ExplainBudget(engine.explain_checks, engine.explain_evaluations)
    stale = [engine.clusters[s["cluster"]] for s in skipped if s.get("reason") == "cluster_stale"]
    for cluster in list(clusters) + stale:
        plan = plans.get(cluster.name)
        if plan is None:
            plan = next(iter(plans.values()), None)
            if plan is None:
                continue
        for alt in plan.alts:
            key = (alt.claim_idx, alt.request_idx, alt.sub_idx)
            entry = requests.get(key)
            if entry is None:
                entry = requests[key] = {
                    "claim": plan.claims[alt.claim_idx].ref.split(" ", 1)[1], "request": alt.name,
                    "deviceClassName": alt.class_name, "allocationMode": "All" if alt.all_mode else "ExactCount",
                    "count": None if alt.all_mode else alt.count, "considered": 0,
                    "dropped": {s: 0 for s in STAGES}, "available": 0, "available_by_node": Counter(),
                    "_near": Counter(), "_exprs": alt.sel.request_exprs, "_selector_matching": 0,
                    "clusters_matching": Counter(), "not_examined": 0, "_errors": {}}
            _count_alt(engine, group, cluster, alt, entry, cluster in stale, plan.fp, spend)
    out_requests = []
    for entry in requests.values():
        by_node = entry.pop("available_by_node")
        near = entry.pop("_near")
        exprs = entry.pop("_exprs")
        matching = entry.pop("_selector_matching")
        entry["selector_errors"] = selector_errors(entry.pop("_errors"))
        if not entry["selector_errors"]:
            del entry["selector_errors"]
        entry["_matching"] = matching
        if entry["not_examined"]:
            entry["sampled"] = True
        else:
            del entry["not_examined"]
        entry["dropped"] = {k: v for k, v in entry["dropped"].items() if v}
        entry["best_nodes"] = [{"node": n, "available": c} for n, c in
                               sorted(by_node.items(), key=lambda kv: (-kv[1], kv[0]))[:BEST_NODES_LISTED]]
        entry["nearest_miss"] = [{"selector": i, "expression": exprs[i], "would_match": c}
                                 for i, c in sorted(near.items())]
        entry["summary"] = _summary(entry, matching)
        # Where devices matching the selectors exist (free or not): the only clusters whose released devices
        # can ever serve this request (the claims service wakes a pending claim only for those).
        entry["clusters_matching"] = dict(sorted((c, n) for c, n in entry["clusters_matching"].items() if n))
        out_requests.append(entry)
    if reason == Reason.UNSATISFIABLE and _errors_only(out_requests):
        reason = Reason.SELECTOR_ERROR_ON_ALL_CANDIDATES
    for r in out_requests:
        del r["_matching"]
    summary = "; ".join(f"{r['claim']}/{r['request']}: {r['summary']}" for r in out_requests) or _no_requests(
        reason, skipped)
    if node_errors:
        summary += f"; {len(node_errors)} node(s) failed with an error: {node_errors[0].message}"
    pools = [{"cluster": c.name, "pool": p.pool_id, "generation": p.generation,
              "state": "incomplete" if p.incomplete else "invalid",
              "detail": p.invalid_reason if p.invalid else f"{len(p.slices)} slice(s) of generation {p.generation}"}
             for c in clusters for p in c.pools if not p.usable][:MAX_NODES_LISTED]
    out = {
        "reason": reason,
        "policy": "BinPack",
        "unusable_pools": pools,
        "summary": summary,
        "requests": out_requests,
        "clusters": [{"cluster": c.name, "nodes": len(c.nodes), "eligible": True} for c in clusters]
        + [dict(s, eligible=False) for s in skipped],
        "nodes": node_log[:MAX_NODES_LISTED],
        "nodes_examined": len(node_log),
        "errors": [e.message for e in node_errors[:MAX_NODES_LISTED]],
        "search": {"steps": budget.steps if budget else 0},
    }
    if any(r.get("sampled") for r in out_requests):
        out["sampled"] = True
    return out


def _count_alt(engine, group, cluster, alt, entry, stale: bool, plan_fp: tuple, spend: ExplainBudget) -> None:
    """Charge every device of ``cluster`` to the first check it fails for ``alt``, into ``entry``.

    The counts are remembered (``explain_walk.ExplainCache``) while nothing changes in the cluster: a round in
    which many claims of one shape fail (a CI burst against a full fleet) counts once per shape, not once per
    claim. The key is the claim shape (identical specs share a plan fingerprint) and nothing about names, so
    the counts are reused while the claim names in the text are the claim's own."""
    if stale:
        counts = stale_counts(cluster)
    else:
        node = cluster.nodes.get(group.node) if group.node is not None else None
        key = (plan_fp, alt.claim_idx, alt.request_idx, alt.sub_idx, cluster.name, group.node) if plan_fp else None
        counts = engine.explained.final_counts(engine, cluster, alt, node, key, spend)
    entry["considered"] += counts["considered"]
    entry["available"] += counts["available"]
    entry["not_examined"] += counts["not_examined"]
    entry["_selector_matching"] += counts["_selector_matching"]
    # Devices whose selectors were not evaluated may match: counted, so that this never under-counts.
    entry["clusters_matching"][cluster.name] += counts["_selector_matching"] + counts["unevaluated"]
    entry["available_by_node"].update(counts["available_by_node"])
    entry["_near"].update(counts["_near"])
    for stage, n in counts["dropped"].items():
        entry["dropped"][stage] += n
    errors = entry["_errors"]
    for key, (n, example) in counts["_errors"].items():
        errors[(cluster.name,) + key] = [n, example]  # one walk per cluster: each key comes once


def selector_errors(errors: dict) -> list[dict]:
    """The CEL runtime errors of one request's selectors, per cluster and selector (the first few), each with
    the devices it failed on and the first of them by name."""
    out = []
    for (cluster, origin, class_name, index, error), (n, (driver, pool, device)) in \
            sorted(errors.items(), key=lambda kv: (-kv[1][0], kv[0]))[:MAX_ERRORS_LISTED]:
        out.append({"origin": origin, "deviceClassName": class_name, "selector": index, "error": error,
                    "cluster": cluster, "devices": n, "driver": driver, "pool": pool, "device": device})
    return out


def _errors_only(requests: list[dict]) -> bool:
    """Is there a request none of whose alternatives has a device its selectors match, but some device on which
    they fail? Then nothing but the failing devices could serve it: the claim waits for the inventory to change
    (``selectors``), and says why."""
    by_request: dict[tuple, list[dict]] = {}
    for r in requests:
        by_request.setdefault((r["claim"], r["request"].split("/", 1)[0]), []).append(r)
    return any(all(r["_matching"] == 0 and not r.get("not_examined") for r in alts)
               and any(r["dropped"].get("cel_error") for r in alts) for alts in by_request.values())


def _no_requests(reason: str, skipped: list[dict]) -> str:
    """The one-line why when no cluster could even be tried: which clusters and why not (kubectl describe
    shows this line; a bare reason code told users nothing)."""
    if not skipped:
        return reason
    named = ", ".join(f"{s['cluster']} ({str(s.get('reason', '')).replace('_', ' ')})" for s in skipped[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    return f"{reason.replace('_', ' ')}: {named}{more}"


def _summary(entry: dict, matching: int) -> str:
    dropped = entry["dropped"]
    parts = [f"{matching} device(s) match the selectors"]
    after = [f"{dropped[s]} {s.replace('_', ' ')}" for s in
             ("allocated", "capacity", "counters", "taint", "binding_conditions_unsupported", "counters_unsupported")
             if dropped.get(s)]
    if after:
        parts.append("of those " + ", ".join(after))
    need = entry["count"]
    avail = entry["available"]
    if need is not None and avail >= need:
        best = entry["best_nodes"][0]["available"] if entry["best_nodes"] else 0
        if best < need:
            parts.append(f"{avail} available but at most {best} on one node (need {need})")
        else:
            parts.append(f"{avail} available: the devices exist but cannot be combined (constraints or other "
                         "requests of the group)")
    else:
        parts.append(f"{avail} available" + (f", need {need}" if need is not None else ""))
    for miss in entry["nearest_miss"]:
        if miss["would_match"]:
            parts.append(f"{miss['would_match']} more would match if selector #{miss['selector']} "
                         f"({miss['expression']}) were relaxed")
    for s in ("pool_incomplete", "pool_invalid", "cluster_stale", "cel_error"):
        if dropped.get(s):
            parts.append(f"{dropped[s]} skipped: {s.replace('_', ' ')}")
    if entry.get("selector_errors"):
        first = entry["selector_errors"][0]
        which = "class" if first["origin"] == "class" else "request"
        parts.append(f"the {which} selector #{first['selector']} fails on {first['devices']} device(s) of "
                     f"cluster {first['cluster']} (e.g. {first['driver']}/{first['pool']}/{first['device']}): "
                     f"{first['error']}")
    if entry.get("not_examined"):
        parts.append(f"sampled: {entry['not_examined']} device(s) not examined (explanation budget)")
    return "; ".join(parts)
