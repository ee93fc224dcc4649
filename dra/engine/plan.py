"""Claims turned into a search plan: requests and their alternatives, classes resolved, input errors raised.

The checks run in upstream's order (features, selectors, admin access, class, allocation mode, then the
per-claim device limit, then constraints) so that a claim with several problems reports the same first one
as the kube-scheduler would, in the same words.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .constraints import Constraint, DistinctAttribute, MatchAttribute
from .quantity import Q, QuantityError
from .selectors import SelectorSet, compile_or_raise
from .types import AllocationError, ErrorCode, Features

ALLOCATION_RESULTS_MAX = 32


def claim_ref(claim: dict) -> str:
    """klog ``KObj`` rendering used in upstream messages: ``claim ns/name`` or ``claim name``."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    return f"claim {ns}/{name}" if ns else f"claim {name}"


@dataclass
class Alt:
    """One way to satisfy a request: the request itself (``exactly``) or one of its ``firstAvailable`` entries."""

    claim_idx: int
    request_idx: int
    sub_idx: int  # -1 for a request without subrequests
    base: str
    sub: str | None
    class_name: str
    klass: dict
    sel: SelectorSet
    all_mode: bool
    count: int
    admin: bool
    tolerations: list
    cap_requests: dict[str, Q] | None
    cap_key: tuple | None = None  # cap_requests by value, for memos that outlive the plan

    @property
    def name(self) -> str:
        return f"{self.base}/{self.sub}" if self.sub is not None else self.base


@dataclass
class RequestPlan:
    name: str
    alts: list[Alt]
    has_sub: bool


@dataclass
class ClaimPlan:
    claim: dict
    ref: str
    requests: list[RequestPlan]
    constraints: list[Constraint]
    min_devices: int  # lower bound of devices, "All" requests counted as 0 (their count depends on the node)
    has_all: bool = False  # some alternative asks for all devices: the bound is the node's to tell


@dataclass
class GroupPlan:
    claims: list[ClaimPlan] = field(default_factory=list)
    fp: tuple = ()  # what the plan was built from (class scope, claim specs): equal fp, equal search
    # (alternative that narrows the nodes most or None, devices of it needed on a node, the same when devices can
    # be shared between requests): set by the engine once per plan (``engine._primary``)
    primary: tuple = ()

    def for_claims(self, claims: list[dict]) -> GroupPlan:
        """The same plan for other claims with equal specs (names and uids differ, the search does not)."""
        return GroupPlan([ClaimPlan(claim, claim_ref(claim), cp.requests, cp.constraints, cp.min_devices, cp.has_all)
                          for claim, cp in zip(claims, self.claims, strict=False)], self.fp, self.primary)

    @property
    def alts(self):
        for c in self.claims:
            for r in c.requests:
                yield from r.alts


def build_plan(claims: list[dict], features: Features, get_class: Callable[[str], dict | None],
               get_selectors: Callable[[str, tuple, tuple], SelectorSet]) -> GroupPlan:
    """Raises ``AllocationError`` for anything upstream treats as an error rather than "does not fit"."""
    plan = GroupPlan()
    for ci, claim in enumerate(claims):
        ref = claim_ref(claim)
        devices = ((claim.get("spec") or {}).get("devices")) or {}
        requests = []
        min_devices = 0
        for ri, request in enumerate(devices.get("requests") or []):
            rname = request.get("name", "")
            subs = request.get("firstAvailable") or []
            if subs and not features.prioritized_list:
                raise AllocationError(ErrorCode.FEATURE_DISABLED, f"{ref}, request {rname}: has subrequests, but the "
                                      "DRAPrioritizedList feature is disabled", claim=ref,
                                      field=f"spec.devices.requests[{ri}].firstAvailable")
            if not features.consumable_capacity:
                exact = request.get("exactly")
                if exact and exact.get("capacity") is not None:
                    raise AllocationError(ErrorCode.FEATURE_DISABLED, f"{ref}, request {rname}: has capacity "
                                          "requests, but the DRAConsumableCapacity feature is disabled", claim=ref,
                                          field=f"spec.devices.requests[{ri}].exactly.capacity")
                for si, sub in enumerate(subs):
                    if sub.get("capacity") is not None:
                        raise AllocationError(ErrorCode.FEATURE_DISABLED, f"{ref}, subrequest {sub.get('name')}: has "
                                              "capacity requests, but the DRAConsumableCapacity feature is disabled",
                                              claim=ref,
                                              field=f"spec.devices.requests[{ri}].firstAvailable[{si}].capacity")
            alts = []
            if subs:
                for si, sub in enumerate(subs):
                    alts.append(_alt(ci, ri, si, rname, sub.get("name", ""), sub, False, ref, features, get_class,
                                     get_selectors, f"spec.devices.requests[{ri}].firstAvailable[{si}]"))
                min_devices += min(a.count for a in alts)
            else:
                exact = request.get("exactly") or {}
                alts.append(_alt(ci, ri, -1, rname, None, exact, True, ref, features, get_class, get_selectors,
                                 f"spec.devices.requests[{ri}].exactly"))
                min_devices += alts[0].count
            requests.append(RequestPlan(rname, alts, bool(subs)))
        if min_devices > ALLOCATION_RESULTS_MAX:
            raise AllocationError(ErrorCode.LIMIT,
                                  f"{ref}: number of requested devices {min_devices} exceeds the claim "
                                  f"limit of {ALLOCATION_RESULTS_MAX}", claim=ref)
        constraints: list[Constraint] = []
        for i, c in enumerate(devices.get("constraints") or []):
            if c.get("matchAttribute"):
                constraints.append(MatchAttribute(c["matchAttribute"], c.get("requests"), i))
            elif c.get("distinctAttribute"):
                constraints.append(DistinctAttribute(c["distinctAttribute"], c.get("requests"), i))
            else:
                raise AllocationError(ErrorCode.INVALID, f"{ref}, constraint #{i}: empty constraint (unsupported "
                                      "constraint type?)", claim=ref, field=f"spec.devices.constraints[{i}]")
        has_all = any(alt.all_mode for rp in requests for alt in rp.alts)
        plan.claims.append(ClaimPlan(claim, ref, requests, constraints, min_devices, has_all))
    return plan


def _alt(ci, ri, si, base, sub, spec, exact, ref, features, get_class, get_selectors, path) -> Alt:
    name = sub if sub is not None else base
    selectors = spec.get("selectors") or []
    exprs = []
    for i, selector in enumerate(selectors):
        cel = (selector or {}).get("cel")
        if not cel or cel.get("expression") is None:
            raise AllocationError(ErrorCode.INVALID, f"{ref}, request {name}, selector #{i}: CEL expression empty "
                                  "(unsupported selector type?)", claim=ref, field=f"{path}.selectors[{i}]")
        exprs.append(cel["expression"])
    admin_set = exact and spec.get("adminAccess") is not None
    if admin_set and not features.admin_access:
        raise AllocationError(ErrorCode.FEATURE_DISABLED, f"{ref}, request {name}: admin access is requested, but the "
                              "feature is disabled", claim=ref, field=f"{path}.adminAccess")
    class_name = spec.get("deviceClassName") or ""
    if not class_name:
        raise AllocationError(ErrorCode.INVALID, f"{ref}, request {name}: missing device class name (unsupported "
                              "request type?)", claim=ref, field=f"{path}.deviceClassName")
    klass = get_class(class_name)
    if klass is None:
        raise AllocationError(ErrorCode.UNKNOWN_CLASS, f"{ref}, request {name}: could not retrieve device class "
                              f"{class_name}: deviceclass.resource.k8s.io \"{class_name}\" not found", claim=ref,
                              field=f"{path}.deviceClassName")
    mode = spec.get("allocationMode") or "ExactCount"
    if mode == "ExactCount":
        count = spec.get("count")
        count = 1 if count is None else int(count)
        all_mode = False
    elif mode == "All":
        count, all_mode = 0, True
    else:
        raise AllocationError(ErrorCode.INVALID, f"{ref}, request {name}: unsupported count mode {mode}", claim=ref,
                              field=f"{path}.allocationMode")
    class_exprs = []
    for i, selector in enumerate((klass.get("spec") or {}).get("selectors") or []):
        cel = (selector or {}).get("cel") or {}
        expr = cel.get("expression")
        if expr is None:
            raise AllocationError(ErrorCode.INVALID, f"class {class_name}: selector #{i}: CEL expression empty "
                                  "(unsupported selector type?)")
        compile_or_raise(expr, consumable_capacity=features.consumable_capacity, origin="class", name=class_name,
                         index=i, field=f"deviceClasses[{class_name}].spec.selectors[{i}].cel.expression")
        class_exprs.append(expr)
    for i, expr in enumerate(exprs):
        compile_or_raise(expr, consumable_capacity=features.consumable_capacity, origin="claim", name=ref, index=i,
                         field=f"{path}.selectors[{i}].cel.expression", claim=ref)
    cap_requests = None
    capacity = spec.get("capacity")
    if capacity is not None and capacity.get("requests"):
        cap_requests = {}
        for cname, value in capacity["requests"].items():
            try:
                cap_requests[cname] = Q.parse(value)
            except QuantityError as exc:
                raise AllocationError(ErrorCode.INVALID, f"{ref}, request {name}: capacity {cname}: {exc}",
                                      claim=ref, field=f"{path}.capacity.requests[{cname}]") from exc
    sel = get_selectors(class_name, tuple(class_exprs), tuple(exprs))
    cap_key = tuple(sorted((n, q.value) for n, q in cap_requests.items())) if cap_requests else None
    return Alt(ci, ri, si, base, sub, class_name, klass, sel, all_mode, count,
               bool(spec.get("adminAccess")) if exact else False, list(spec.get("tolerations") or []), cap_requests,
               cap_key)
