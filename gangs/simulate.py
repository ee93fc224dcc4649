"""``POST /api/v1/simulate/gang``: could this gang start now? What-if placement, nothing written.

Body::

    {"minMember": 8,                                   # default: every member
     "topology": {"levels": [...], "required": "...", "preferred": "..."},
     "members": [{"name": "w0", "claims": [ResourceClaim...]}, ...]
       | "replicas": 8, "claims": [ResourceClaim...],  # N identical members
     "placement": {"clusterSelector": {...}, "preferredCluster": "..."},
     # optional: a hypothetical one-cluster inventory instead of the stored fleet
     "resourceSlices": [...], "nodes": [{"name", "labels"}], "deviceClasses": [...],
     "allocatedDevices": [{"driver", "pool", "device"}]}

Against the stored fleet the answer uses the devices in use now. 200 with the placement (or why not, and
the closest domain); 422 problem+json for invalid input.
"""
from __future__ import annotations

import threading
from typing import Any

from claims.services.engines import EngineCache
from dra.engine import Engine, FleetSnapshot
from dra.engine.simulate import allocated_from_body, snapshot_from_body
from dra.gang import Gang, GangMember, GangPlacer, GangReason, GangSpecError, Topology
from dra.k8s import claims as k8s_claims
from dra.k8s import slices as k8s_slices
from draservice.problems import FieldError
from gangs.spec import MAX_MEMBERS

_KNOWN = {"minMember", "topology", "members", "replicas", "claims", "placement", "resourceSlices", "nodes",
          "deviceClasses", "allocatedDevices"}
# The stored fleet's engine is kept between requests (building one costs far more than a placement); web
# threads take turns on it, and ``commit=False`` leaves it as it was.
_stored = EngineCache()
_stored_lock = threading.Lock()


def _claims(items: Any, path: str, member: str, errors: list) -> list[dict]:
    if not isinstance(items, list) or not items:
        errors.append((path, "Required value: a non-empty list of ResourceClaims"))
        return []
    out = []
    for j, obj in enumerate(items):
        if isinstance(obj, dict):
            meta = {**(obj.get("metadata") or {})}
            meta.setdefault("name", f"{member}-{j}")
            meta.setdefault("namespace", "simulation")
            obj = {**obj, "metadata": meta}
            claim, errs = k8s_claims.normalize_claim(obj, check_cel=False)  # the engine words CEL errors
        else:
            claim, errs = obj, [("", "must be a ResourceClaim object")]
        errors.extend((f"{path}[{j}].{p}" if p else f"{path}[{j}]", r) for p, r in errs)
        out.append(claim)
    return out


def parse(body: Any) -> tuple[Gang, dict | None]:
    """The gang and its cluster label selector (resolved against the fleet's clusters by ``run``)."""
    if not isinstance(body, dict):
        raise FieldError([("", "the body must be a JSON object")])
    errors: list[tuple[str, str]] = [(k, "Forbidden: unknown field") for k in sorted(set(body) - _KNOWN)]
    members: list[GangMember] = []
    if ("members" in body) == ("replicas" in body):
        errors.append(("", "must specify exactly one of members or replicas (with claims)"))
    elif "replicas" in body:
        n = body["replicas"]
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_MEMBERS:
            errors.append(("replicas", f"Invalid value: must be between 1 and {MAX_MEMBERS}"))
        else:
            for i in range(n):
                members.append(GangMember(f"member-{i}", _claims(body.get("claims"), "claims", f"member-{i}",
                                                                 errors if i == 0 else [])))
    else:
        items = body["members"]
        if not isinstance(items, list) or not items or len(items) > MAX_MEMBERS:
            errors.append(("members", f"Invalid value: a list of 1 to {MAX_MEMBERS} members"))
            items = []
        for i, m in enumerate(items):
            name = m.get("name") if isinstance(m, dict) else None
            if not isinstance(name, str) or not name:
                errors.append((f"members[{i}].name", "Required value"))
                name = f"member-{i}"
            members.append(GangMember(name, _claims(m.get("claims") if isinstance(m, dict) else None,
                                                    f"members[{i}].claims", name, errors)))
    topo_in = body.get("topology")
    topology = Topology()
    if topo_in is not None and not isinstance(topo_in, dict):
        errors.append(("topology", "must be an object"))
    elif topo_in is not None and not isinstance(topo_in.get("levels") or [], list):
        errors.append(("topology.levels", "must be a list of node label keys"))
    elif topo_in is not None:
        topology = Topology.from_dict(topo_in)
    placement = body.get("placement") or {}
    if not isinstance(placement, dict):
        errors.append(("placement", "must be an object"))
        placement = {}
    min_member = body.get("minMember", len(members))
    if not isinstance(min_member, int) or isinstance(min_member, bool):
        errors.append(("minMember", "must be an integer"))
        min_member = len(members)
    selector = placement.get("clusterSelector")
    if selector is not None and not (isinstance(selector, dict) and selector):
        errors.append(("placement.clusterSelector", "must be a non-empty map of cluster label to value"))
    gang = Gang("simulation", members, min_member, topology, preferred_cluster=placement.get("preferredCluster"))
    if members:
        errors += gang.errors()
    if errors:
        raise FieldError(errors)
    return gang, selector


def run(body: Any) -> dict:
    gang, selector = parse(body)
    if "resourceSlices" in body:
        snapshot, allocated = _inline_inventory(body)
        placer = GangPlacer(Engine(snapshot, allocated), snapshot)
        outcome = placer.place(gang, commit=False)
    else:
        from claims.placement import clusters_matching
        from claims.services import fleet

        view = fleet.current_view()
        gang.allowed_clusters = clusters_matching(selector, view.cluster_labels) if selector else None
        with _stored_lock:
            try:
                placer = _stored.placer_for(view, fleet.rows_in_use())
                outcome = placer.place(gang, commit=False)
            except BaseException:
                _stored.reset()
                raise
    if outcome.reason == GangReason.INVALID and outcome.error is not None:
        raise FieldError([(f"members[{outcome.error_member}]", outcome.error.message)], detail=outcome.message,
                         title="Cannot simulate this gang")
    return {
        "placed": outcome.placed, "cluster": outcome.cluster, "domain": outcome.domain,
        "preferredDomains": outcome.preferred_domains(gang.topology),
        "members": [{"name": p.member, "node": p.node, "labels": p.labels,
                     "claims": [{"name": c.name, "allocation": c.allocation} for c in p.outcome.claims]}
                    for p in outcome.placements],
        "unplaced": outcome.unplaced, "reason": outcome.reason, "message": outcome.message,
        "closest": outcome.closest.to_dict() if outcome.closest else None,
        "domains": [d.to_dict() for d in outcome.domains], "diagnostics": outcome.diagnostics,
    }


def _inline_inventory(body: dict) -> tuple[FleetSnapshot, list]:
    errors: list[tuple[str, str]] = []

    def normalized(key, fn):
        items = body.get(key) or []
        if not isinstance(items, list):
            errors.append((key, "Invalid value: must be a list"))
            return []
        out = []
        for i, obj in enumerate(items):
            try:
                out.append(fn(obj))
            except k8s_slices.ObjectInvalid as exc:
                errors.extend(exc.prefixed(f"{key}[{i}]").errors)
        return out

    slices = normalized("resourceSlices", k8s_slices.normalize_resource_slice)
    classes = normalized("deviceClasses", lambda obj: k8s_slices.normalize_device_class(obj, None))
    for i, n in enumerate(body.get("nodes") or []):
        if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not n["name"]:
            errors.append((f"nodes[{i}].name", "Required value"))
    for i, item in enumerate(body.get("allocatedDevices") or []):
        missing = [f for f in ("driver", "pool", "device") if not isinstance(item, dict) or not item.get(f)]
        errors.extend((f"allocatedDevices[{i}].{f}", "Required value") for f in missing)
    if errors:
        raise FieldError(errors)
    snapshot = snapshot_from_body({"nodes": body.get("nodes") or [], "deviceClasses": classes}, slices=slices)
    return snapshot, allocated_from_body({"allocatedDevices": body.get("allocatedDevices") or []})


__all__ = ["run", "parse", "GangSpecError"]
