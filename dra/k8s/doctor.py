"""The manifest doctor: DRA manifests copied from articles written for older APIs -> ``resource.k8s.io/v1``.

``diagnose(obj, fleet)`` says what is wrong with one object and, where a machine can fix it, gives the fixed
object (``rewrite``) and every change made, each with its reason:

* ResourceClaim / ResourceClaimTemplate in ``v1beta1``, ``v1beta2`` or ``v1alpha3`` (v1alpha3 has the v1beta1
  request shape) -> v1, through ``dra.k8s.claims``'s own conversion; a ``v1`` one written in the v1beta1 shape
  (``deviceClassName``, ``selectors``, ``count``... directly on the request) gets its fields moved under
  ``exactly``; ``firstAvailable`` requests are left as they are.
* DeviceClass in any older version -> v1 (v1alpha3's ``suitableNodes`` has no v1 equivalent and goes).
* CEL selectors everywhere: ``dra.k8s.doctor_cel`` (names without a domain, ordering on quantities).
* ``v1alpha2`` (classic DRA: ResourceClass with ``driverName``/``parametersRef``, claims with ``parametersRef``):
  the parameters are opaque vendor objects, so there is no machine rewrite; an explanation and a v1 skeleton
  (``skeleton``) with the parts that can be known filled in and a TODO where the parameters go.

A rewrite is only offered when it passes the same validation a create request does; otherwise ``rewrite`` is
None, ``changes`` still lists what could be fixed and ``remaining`` what could not. Pure: no Django, no
database; the caller builds the ``FleetVocabulary`` (inventory's stored devices, or ResourceSlices).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from celpy.celparser import CELParseError

from dra.cel import MAX_EXPRESSION_LENGTH, compile_selector
from dra.cel.analysis import drivers as expression_drivers
from dra.cel.compiler import _parse as parse_cel  # the engine's own parser (thread-safe, shared)
from dra.k8s import claims as k8s_claims
from dra.k8s import slices as k8s_slices
from dra.k8s.doctor_cel import FleetVocabulary, WorkBudget, fix_selector
from dra.k8s.fields import GROUP, V1, Errors, ObjectInvalid, check_name

__all__ = ["Diagnosis", "FleetVocabulary", "WorkBudget", "diagnose", "diagnose_body", "is_kubernetes_object",
           "objects_in", "validate_claim_like", "validate_device_class"]

CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
_CONVERTED = ("v1beta2", "v1beta1", "v1alpha3")  # versions with a machine conversion to v1
_OLDER_VERSION = ("{version} is an older DRA API version; v1 (GA in Kubernetes 1.34) is the one current clusters "
                  "serve by default and this service stores")
_PARAMETERS_TODO = ("TODO: the settings of the {kind} {name!r} that parametersRef pointed to, in the form the "
                    "driver's DRA plugin takes as opaque configuration (see the driver's documentation)")


@dataclass
class Diagnosis:
    """``outcome``: "valid" (nothing to change), "rewrite" (``rewrite`` is the v1 object to send), "skeleton"
    (no machine rewrite; ``skeleton`` is a v1 starting point), or "unfixable" (see ``explanation`` and
    ``remaining``). ``changes``: ``{field, was, now, why}`` with ``field`` a path in the rewritten object."""

    kind: str
    api_version: str
    outcome: str
    explanation: str
    rewrite: dict | None = None
    changes: list[dict] = field(default_factory=list)
    skeleton: dict | None = None
    remaining: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind, "apiVersion": self.api_version, "outcome": self.outcome,
                               "explanation": self.explanation, "rewrite": self.rewrite, "changes": self.changes}
        if self.skeleton is not None:
            out["skeleton"] = self.skeleton
        if self.remaining:
            out["remaining"] = self.remaining
        return out


def is_kubernetes_object(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("apiVersion"), str) and isinstance(obj.get("kind"), str)


def objects_in(body: Any) -> list | None:
    """The objects of a request body: one object, a JSON/YAML list of them, a ``kind: List`` or ``{"items":
    [...]}`` (as the batch endpoint takes); None when the body is none of these."""
    if isinstance(body, list):
        return body
    if isinstance(body, dict) and body.get("kind", "List") == "List" and isinstance(body.get("items"), list):
        return body["items"]
    return [body] if is_kubernetes_object(body) else None


def diagnose_body(body: Any, fleet: FleetVocabulary | None) -> list[Diagnosis] | None:
    """Every object of a request body (one budget for all), or None when the body holds no object."""
    objects = objects_in(body)
    budget = WorkBudget()
    return None if objects is None else [diagnose(obj, fleet, budget) for obj in objects]


def diagnose(obj: Any, fleet: FleetVocabulary | None, budget: WorkBudget | None = None) -> Diagnosis:
    """What is wrong with one manifest and how to write it for ``resource.k8s.io/v1``. ``budget``: the CEL
    parsing the doctor may do (share one between the objects of a request)."""
    budget = budget if budget is not None else WorkBudget()
    if not is_kubernetes_object(obj):
        return Diagnosis("", "", "unfixable", "not a Kubernetes object: apiVersion and kind are required")
    kind, api_version = obj["kind"], obj["apiVersion"]
    group, _, version = api_version.rpartition("/")
    if group != GROUP:
        return Diagnosis(kind, api_version, "unfixable", f"{api_version} is not the DRA API ({GROUP}); the "
                                                         "doctor only knows DRA objects")
    if version == "v1alpha2":
        return _classic_dra(obj, fleet)
    if version != "v1" and version not in _CONVERTED:
        return Diagnosis(kind, api_version, "unfixable", f"{api_version} is not a DRA version the doctor knows "
                                                         f"(v1alpha2, v1alpha3, v1beta1, v1beta2, v1)")
    if kind in CLAIM_KINDS:
        return _claim_like(obj, version, fleet, budget)
    if kind == "DeviceClass":
        return _device_class(obj, version, fleet, budget)
    return Diagnosis(kind, api_version, "unfixable", f"the doctor rewrites ResourceClaims, ResourceClaimTemplates "
                                                     f"and DeviceClasses, not {kind}s")


# --------------------------------------------------------------------------------------- claims and templates

def validate_claim_like(obj: dict) -> Errors:
    """The errors a create request reports for a v1 ResourceClaim or ResourceClaimTemplate (spec checks of
    ``dra.k8s.claims``; a template's claim spec sits at ``spec.spec``)."""
    if obj.get("kind") == "ResourceClaim":
        return k8s_claims.normalize_claim(obj)[1]
    spec = obj.get("spec")
    meta = obj.get("metadata")
    errors: Errors = check_name(meta.get("name") if isinstance(meta, dict) else None, "metadata.name")
    if not isinstance(spec, dict):
        return errors + [("spec", "Required value")]
    claim = {"apiVersion": V1, "kind": "ResourceClaim", "metadata": {"name": "x"}, "spec": spec.get("spec") or {}}
    return errors + [(f"spec.{path}", reason) for path, reason in k8s_claims.normalize_claim(claim)[1]]


def _claim_like(obj: dict, version: str, fleet: FleetVocabulary | None, budget: WorkBudget) -> Diagnosis:
    kind = obj["kind"]
    if version == "v1" and not validate_claim_like(obj):
        return _valid(obj)
    out = copy.deepcopy(obj)
    changes: list[dict] = []
    is_template = kind == "ResourceClaimTemplate"
    prefix = "spec.spec" if is_template else "spec"
    holder = out.get("spec") if is_template else out
    spec = holder.get("spec") if isinstance(holder, dict) else None
    if version != "v1":
        changes.append(_change("apiVersion", obj["apiVersion"], V1, _OLDER_VERSION.format(version=version)))
        out["apiVersion"] = V1
    if isinstance(spec, dict):
        if version == "v1alpha3" and "controller" in spec:
            changes.append(_change(f"{prefix}.controller", spec.pop("controller"), None,
                                   "v1alpha3's controller field was removed in v1beta1: the scheduler allocates"))
        _requests_to_v1(spec, version, prefix, changes)
        _fix_claim_selectors(spec, prefix, fleet, changes, budget)
    return _finish(obj, out, changes, validate_claim_like(out))


def _requests_to_v1(spec: dict, version: str, prefix: str, changes: list[dict]) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return
    for i, request in enumerate(devices["requests"]):
        flat = isinstance(request, dict) and any(k in request for k in k8s_claims.V1BETA1_EXACT_FIELDS)
        if not flat or "exactly" in request:
            continue
        if version == "v1" and request.get("firstAvailable"):
            continue  # firstAvailable is already v1; validation says what sits next to it
        moved = [k for k in k8s_claims.V1BETA1_EXACT_FIELDS if k in request]
        devices["requests"][i] = k8s_claims.v1beta1_request_to_v1(request)
        why = (f"{', '.join(moved)} sat directly on the request in v1beta1 (and v1alpha3); v1 puts them under "
               "exactly (or gives alternatives in firstAvailable)")
        # Copies: the selectors moved here are rewritten in place later, and this change shows the move alone.
        changes.append(_change(f"{prefix}.devices.requests[{i}]", copy.deepcopy(request),
                               copy.deepcopy(devices["requests"][i]), why))


def _fix_claim_selectors(spec: dict, prefix: str, fleet: FleetVocabulary | None, changes: list[dict],
                         budget: WorkBudget) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return
    for i, request in enumerate(devices["requests"]):
        if not isinstance(request, dict):
            continue
        path = f"{prefix}.devices.requests[{i}]"
        if isinstance(request.get("exactly"), dict):
            _fix_selectors(request["exactly"], f"{path}.exactly", _class_hint(request["exactly"], fleet), fleet,
                           changes, budget)
        first = request.get("firstAvailable")
        for j, sub in enumerate(first if isinstance(first, list) else []):
            if isinstance(sub, dict):
                _fix_selectors(sub, f"{path}.firstAvailable[{j}]", _class_hint(sub, fleet), fleet, changes, budget)


def _class_hint(request: dict, fleet: FleetVocabulary | None) -> frozenset[str]:
    """The drivers the request's DeviceClass selects: a name several drivers publish means that driver's."""
    if fleet is None or not isinstance(request.get("deviceClassName"), str):
        return frozenset()
    return fleet.class_drivers.get(request["deviceClassName"], frozenset())


def _fix_selectors(holder: dict, path: str, drivers: frozenset[str], fleet: FleetVocabulary | None,
                   changes: list[dict], budget: WorkBudget) -> None:
    selectors = holder.get("selectors")
    if not isinstance(selectors, list):
        return
    for k, selector in enumerate(selectors):
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if not isinstance(expression, str) or not expression.strip():
            continue
        fixed = fix_selector(expression, fleet, drivers, budget)
        if fixed.changed:
            assert isinstance(cel, dict)
            cel["expression"] = fixed.expression
            changes.append(_change(f"{path}.selectors[{k}].cel.expression", expression, fixed.expression,
                                   "; ".join(fixed.reasons)))
        for note in fixed.unresolved:
            changes.append(_change(f"{path}.selectors[{k}].cel.expression", expression, None,
                                   f"not rewritten: {note}"))


# --------------------------------------------------------------------------------------------- DeviceClass

def validate_device_class(obj: dict) -> Errors:
    try:
        k8s_slices.normalize_device_class(obj, compile_selector)
    except ObjectInvalid as exc:
        return exc.errors
    return []


def _device_class(obj: dict, version: str, fleet: FleetVocabulary | None, budget: WorkBudget) -> Diagnosis:
    if version == "v1" and not validate_device_class(obj):
        return _valid(obj)
    out = copy.deepcopy(obj)
    changes: list[dict] = []
    if version != "v1":
        changes.append(_change("apiVersion", obj["apiVersion"], V1, _OLDER_VERSION.format(version=version)))
        out["apiVersion"] = V1
    spec = out.get("spec")
    if isinstance(spec, dict):
        if "suitableNodes" in spec:
            changes.append(_change("spec.suitableNodes", spec.pop("suitableNodes"), None,
                                   "v1alpha3's suitableNodes has no v1 field: where a device can be used is "
                                   "said by the ResourceSlices that publish it"))
        drivers = _selector_drivers(spec.get("selectors"), budget)
        _fix_selectors(spec, "spec", drivers, fleet, changes, budget)
    return _finish(obj, out, changes, validate_device_class(out))


def _selector_drivers(selectors: Any, budget: WorkBudget) -> frozenset[str]:
    """Drivers a class's selectors name (``device.driver == "x"``), to place the names its other selectors use."""
    found: set[str] = set()
    for selector in selectors if isinstance(selectors, list) else []:
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if isinstance(expression, str) and len(expression) <= MAX_EXPRESSION_LENGTH \
                and budget.spend(len(expression)):
            try:
                found |= expression_drivers(parse_cel(expression)) or frozenset()
            except CELParseError:
                continue  # a syntax error names no driver we can read; fix_selector reports it
    return frozenset(found)


# --------------------------------------------------------------------------------------- v1alpha2 (classic DRA)

def _classic_dra(obj: dict, fleet: FleetVocabulary | None) -> Diagnosis:
    kind, api_version = obj["kind"], obj["apiVersion"]
    name = _as_dict(obj.get("metadata")).get("name") or "TODO-name"
    if kind == "ResourceClass":
        driver = obj.get("driverName")
        driver = driver if isinstance(driver, str) and driver else "TODO.driver.example.com"
        ref = obj.get("parametersRef")
        spec: dict = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
        if isinstance(ref, dict):
            spec["config"] = [{"opaque": {"driver": driver, "parameters": {
                "TODO": _PARAMETERS_TODO.format(kind=ref.get("kind") or "object", name=ref.get("name"))}}}]
        skeleton = {"apiVersion": V1, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}
        explanation = (f"{api_version} ResourceClass is classic DRA (Kubernetes 1.26-1.30): the driver's controller "
                       f"allocated from opaque parameters{' (parametersRef)' if ref else ''}. It was removed in "
                       "1.31 and has no machine rewrite: v1 uses a DeviceClass whose CEL selectors pick devices "
                       "from the attributes drivers publish. The skeleton selects every device of driver "
                       f"{driver!r}; narrow it with selectors on attributes, and move what the parameters said "
                       "into spec.config[].opaque in the form the driver documents.")
        return Diagnosis(kind, api_version, "skeleton", explanation, skeleton=skeleton)
    if kind in CLAIM_KINDS:
        spec_holder = obj.get("spec") if kind == "ResourceClaim" else _as_dict(obj.get("spec")).get("spec")
        return _classic_claim(obj, _as_dict(spec_holder), name, fleet)
    return Diagnosis(kind, api_version, "unfixable",
                     f"{api_version} {kind} is classic DRA (removed in Kubernetes 1.31) with no v1 counterpart: "
                     "what it said goes into DeviceClass selectors and claim selectors, or into opaque config")


def _classic_claim(obj: dict, spec: dict, name: str, fleet: FleetVocabulary | None) -> Diagnosis:
    kind, api_version = obj["kind"], obj["apiVersion"]
    class_name = spec.get("resourceClassName")
    class_name = class_name if isinstance(class_name, str) and class_name else "TODO-device-class"
    ref = spec.get("parametersRef")
    drivers = fleet.class_drivers.get(class_name, frozenset()) if fleet is not None else frozenset()
    driver = next(iter(drivers)) if len(drivers) == 1 else "TODO.driver.example.com"
    claim_spec: dict = {"devices": {"requests": [{"name": "device", "exactly": {
        "deviceClassName": class_name, "allocationMode": "ExactCount", "count": 1}}]}}
    if isinstance(ref, dict):
        claim_spec["devices"]["config"] = [{"requests": ["device"], "opaque": {"driver": driver, "parameters": {
            "TODO": _PARAMETERS_TODO.format(kind=ref.get("kind") or "object", name=ref.get("name"))}}}]
    meta = {k: v for k, v in _as_dict(obj.get("metadata")).items() if k in ("name", "namespace", "labels")} \
        or {"name": name}
    skeleton = {"apiVersion": V1, "kind": kind, "metadata": meta,
                "spec": claim_spec if kind == "ResourceClaim" else {"spec": claim_spec}}
    explanation = (f"{api_version} {kind} is classic DRA (Kubernetes 1.26-1.30): it named a ResourceClass "
                   f"({class_name!r}){' and opaque parameters (parametersRef)' if ref else ''} for the driver's "
                   "controller to interpret. It was removed in 1.31 and has no machine rewrite. The skeleton "
                   "asks for one device of the DeviceClass of the same name (create it from the ResourceClass, "
                   "the doctor gives a skeleton for that too); say how many and which devices with count and CEL "
                   "selectors, and move what the parameters said into spec.devices.config[].opaque.")
    return Diagnosis(kind, api_version, "skeleton", explanation, skeleton=skeleton)


# --------------------------------------------------------------------------------------------- shared

def _as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _change(path: str, was: Any, now: Any, why: str) -> dict:
    return {"field": path, "was": was, "now": now, "why": why}


def _valid(obj: dict) -> Diagnosis:
    return Diagnosis(obj["kind"], obj["apiVersion"], "valid",
                     f"already a valid {V1} {obj['kind']}: nothing to change")


def _finish(obj: dict, out: dict, changes: list[dict], errors: Errors) -> Diagnosis:
    kind, api_version = obj["kind"], obj["apiVersion"]
    remaining = [{"field": f, "reason": r} for f, r in errors]
    applied = [c for c in changes if c["now"] is not None or not c["why"].startswith("not rewritten")]
    if not errors and applied:
        whys = "; ".join(f"{c['field']}: {c['why']}" for c in applied)
        return Diagnosis(kind, api_version, "rewrite", f"rewritten for {V1} ({len(applied)} change"
                         f"{'' if len(applied) == 1 else 's'}): {whys}", rewrite=out, changes=changes)
    if not errors:
        return _valid(obj)
    reasons = "; ".join(f"{e['field']}: {e['reason']}" for e in remaining[:5])
    unresolved = [c["why"] for c in changes if c["now"] is None and c["why"].startswith("not rewritten")]
    explanation = ("no machine rewrite: after " + (f"{len(applied)} change(s)" if applied else "no change")
                   + f", the object is still invalid: {reasons}"
                   + ("; " + "; ".join(unresolved) if unresolved else ""))
    return Diagnosis(kind, api_version, "unfixable", explanation, changes=changes, remaining=remaining)
