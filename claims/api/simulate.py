"""``POST /api/v1/simulate``: what-if allocation of one pod's claims, nothing written.

Body (issue 4; the format of the upstream conformance vectors)::

    {"deviceClasses": [DeviceClass...], "resourceSlices": [ResourceSlice v1|v1beta2|v1beta1...],
     "nodes": [{"name", "labels"}], "node": "node-1" | {"name", "labels"},
     "deviceTaintRules": [DeviceTaintRule...],
     "allocatedDevices": [{"driver", "pool", "device"}],
     "allocatedSharedDevices": [{"driver", "pool", "device", "shareID"}],
     "allocatedCapacity": [{"driver", "pool", "device", "capacity": {"memory": "8Gi"}}],
     "features": {"adminAccess": true, ...},
     "claims": [ResourceClaim...]}

With ``resourceSlices`` the body is the whole inventory (one cluster). Without it the claims are simulated
against the stored fleet and the devices in use now (the body's classes override fleet classes of the same
name, its ``allocated*`` lists add to what is in use, and ``cluster`` may restrict the clusters).

200 ``{"allocated", "cluster", "node", "claims": [{"name", "namespace", "allocation"}], "reason", "message",
"diagnostics"}``, and against the stored fleet ``"queue": {"name", "admitted"}`` -- or, where the claim would
wait (its queue's quota refuses it: ``allocated`` false, reason ``WaitingForQuota``; or no room),
``{"name", "position", "estimatedStartTime" | "estimate", "preemptions": [{"namespace", "name"}]}`` (the
scheduler's cycle on a copy: ``scheduler.services.simulate``); 422 problem+json for invalid input, with
upstream's wording in ``detail`` where upstream has one (unknown class, CEL errors, limits, ``All`` over an
incomplete pool).
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.services import queueing
from dra.cel import REQUEST_COST_BUDGET, CostBudgetExhausted, CostMeter, check_selector_cost, metered
from dra.engine import AllocationError, Features, FleetSnapshot, simulate
from dra.engine.simulate import allocated_from_body, node_name_of, snapshot_from_body
from dra.k8s import claims as k8s_claims
from dra.k8s import slices as k8s_slices
from draservice.permissions import IsAuthenticatedPrincipal
from draservice.problems import FieldError

MAX_CLAIMS = 128  # a pod references at most 128 ResourceClaims
_LIST_FIELDS = ("deviceClasses", "resourceSlices", "nodes", "deviceTaintRules", "allocatedDevices",
                "allocatedSharedDevices", "allocatedCapacity", "claims")
_KNOWN = frozenset(_LIST_FIELDS) | {"node", "features", "cluster"}


def _normalized(items: list, field: str, normalize) -> tuple[list[dict], list[tuple[str, str]]]:
    out, errors = [], []
    for i, obj in enumerate(items):
        try:
            out.append(normalize(obj))
        except k8s_slices.ObjectInvalid as exc:
            errors.extend(exc.prefixed(f"{field}[{i}]").errors)
    return out, errors


def parse_body(body: Any) -> dict:
    """Validated engine inputs from a simulate body; raises ``FieldError`` with every problem found."""
    if not isinstance(body, dict):
        raise FieldError([("", "the body must be a JSON object")])
    errors: list[tuple[str, str]] = [(k, "Forbidden: unknown field") for k in sorted(set(body) - _KNOWN)]
    for key in _LIST_FIELDS:
        if key in body and not isinstance(body[key], list):
            errors.append((key, "Invalid value: must be a list"))
    if errors:
        raise FieldError(errors)
    claims_in = body.get("claims") or []
    if not claims_in:
        errors.append(("claims", "Required value: at least one ResourceClaim"))
    if len(claims_in) > MAX_CLAIMS:
        errors.append(("claims", f"Too many: {len(claims_in)}: must have at most {MAX_CLAIMS} items"))
    claims = []
    for i, obj in enumerate(claims_in):
        if isinstance(obj, dict) and not (obj.get("metadata") or {}).get("name"):
            obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "name": f"claim-{i}"}}
        # CEL is compiled by the engine, which words compile errors the way the scheduler does; a selector
        # too expensive to store is refused here, with its field path, before anything runs.
        claim, claim_errors = k8s_claims.normalize_claim(obj, check_cel=False, check_cost=True) \
            if isinstance(obj, dict) else (obj, [("", "must be a ResourceClaim object")])
        errors.extend((f"claims[{i}].{p}" if p else f"claims[{i}]", r) for p, r in claim_errors)
        claims.append(claim)
    classes, errs = _normalized(body.get("deviceClasses") or [], "deviceClasses",
                                lambda obj: k8s_slices.normalize_device_class(obj, check_selector_cost))
    errors += errs
    slices, errs = _normalized(body.get("resourceSlices") or [], "resourceSlices", k8s_slices.normalize_resource_slice)
    errors += errs
    rules, errs = _normalized(body.get("deviceTaintRules") or [], "deviceTaintRules",
                              k8s_slices.normalize_device_taint_rule)
    errors += errs
    for i, n in enumerate(body.get("nodes") or []):
        if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not n["name"]:
            errors.append((f"nodes[{i}].name", "Required value"))
    node = body.get("node")
    if node is not None and not (isinstance(node, str) or (isinstance(node, dict) and node.get("name"))):
        errors.append(("node", "Invalid value: a node name or {\"name\", \"labels\"}"))
    for key in ("allocatedDevices", "allocatedSharedDevices", "allocatedCapacity"):
        for i, item in enumerate(body.get(key) or []):
            missing = [f for f in ("driver", "pool", "device") if not isinstance(item, dict) or not item.get(f)]
            errors.extend((f"{key}[{i}].{f}", "Required value") for f in missing)
    try:
        features = Features.from_dict(body.get("features"))
    except (ValueError, AttributeError) as exc:
        errors.append(("features", f"Invalid value: {exc}"))
        features = Features()
    if errors:
        raise FieldError(errors)
    return {"claims": claims, "classes": classes, "slices": slices, "rules": rules, "features": features,
            "node": node_name_of(body), "stored_fleet": "resourceSlices" not in body,
            "cluster": body.get("cluster")}


def stored_fleet(body: dict, parsed: dict) -> tuple[FleetSnapshot, list]:
    """The stored fleet and the devices in use now, with the body's what-if additions."""
    from claims.services import fleet  # the worker's own view of the inventory: same snapshot, same rows

    view = fleet.current_view()
    snapshot = view.snapshot
    if parsed["classes"]:
        overrides = {c["metadata"]["name"] for c in parsed["classes"]}
        snapshot = FleetSnapshot(clusters=snapshot.clusters,
                                 device_classes=[c for c in snapshot.device_classes
                                                 if c["metadata"]["name"] not in overrides] + parsed["classes"])
    allocated = list(fleet.rows_in_use().values())
    cluster = parsed["cluster"]
    if cluster:
        allocated += allocated_from_body(body, cluster=cluster)
    return snapshot, allocated


def run_simulation(body: Any) -> dict:
    """The 200 body for a simulate request; raises ``FieldError`` (422) for invalid input."""
    parsed = parse_body(body)
    if parsed["stored_fleet"]:
        snapshot, allocated = stored_fleet(body, parsed)
        allowed = [parsed["cluster"]] if parsed["cluster"] else None
    else:
        snapshot = snapshot_from_body({**body, "deviceClasses": parsed["classes"],
                                       "deviceTaintRules": parsed["rules"]}, slices=parsed["slices"])
        allocated = allocated_from_body(body)
        allowed = None
    try:
        # All CEL evaluations of the simulation share one budget (each also has its own, dra.cel's default).
        with metered(CostMeter(REQUEST_COST_BUDGET)):
            outcome = simulate(snapshot, allocated, parsed["claims"], node=parsed["node"],
                               features=parsed["features"], allowed_clusters=allowed)
    except CostBudgetExhausted as exc:
        raise FieldError([("claims", exc.reason)], title="CEL budget exhausted",
                         detail=f"the simulation was stopped: {exc.reason}") from exc
    except AllocationError as exc:
        raise FieldError([(_error_field(exc, parsed["claims"]), exc.message)], detail=exc.message,
                         title="Cannot simulate this input") from exc
    out = outcome.to_dict()
    answer = {
        "allocated": outcome.allocated,
        "cluster": outcome.cluster,
        "node": outcome.node,
        "claims": [{"name": c["name"], "namespace": c["namespace"], "allocation": c["allocation"]}
                   for c in out["claims"]] if outcome.allocated else
                  [{"name": (c.get("metadata") or {}).get("name"),
                    "namespace": (c.get("metadata") or {}).get("namespace", ""), "allocation": None}
                   for c in parsed["claims"]],
        "reason": outcome.reason,
        "message": outcome.message,
        "diagnostics": outcome.diagnostics,
    }
    # Against the stored fleet, what the worker would do: queue admission, and where the claim would wait.
    return queueing.simulated(parsed["claims"], answer) if parsed["stored_fleet"] else answer


def _error_field(exc: AllocationError, claims: list[dict]) -> str:
    """``claims[i].<path>`` for an error about one claim's field, else the most specific path known."""
    if exc.claim and exc.field and not exc.field.startswith("deviceClasses"):
        for i, c in enumerate(claims):
            meta = c.get("metadata") or {}
            ref = f"claim {meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else \
                f"claim {meta.get('name')}"
            if ref == exc.claim:
                return f"claims[{i}].{exc.field}"
    return exc.field or "claims"


class SimulateView(APIView):
    """What-if allocation; see the module docstring for the body."""

    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT},
                   summary="Simulate allocating claims (nothing is written)")
    def post(self, request):
        return Response(run_simulation(request.data))
