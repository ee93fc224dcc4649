"""ResourceClaim handling as the Kubernetes API server does it: version conversion, defaulting, validation.

* ``convert_claim_to_v1`` turns ``resource.k8s.io/v1beta1`` and ``v1beta2`` claims into ``v1`` (v1beta2 has the
  v1 shape; v1beta1 keeps request fields flat on the request instead of under ``exactly``).
* ``default_claim`` applies the defaults of ``pkg/apis/resource/v1/defaults.go``.
* ``validate_claim`` applies the checks and limits of ``pkg/apis/resource/validation`` that matter to
  allocation, and returns ``[(field_path, reason)]`` in upstream's wording (``field.ErrorList``).
* ``normalize_claim`` does all three in order, as a create request would go through them.

Nothing here mutates its input.
"""
from __future__ import annotations

import json
from typing import Any

from dra.cel import CELCompileError, CELCostLimitExceeded, check_selector_cost, compile_selector
from dra.engine.quantity import QuantityError, parse_quantity
from dra.k8s.fields import (
    DNS_LABEL,
    GROUP,
    Errors,
    ObjectInvalid,
    check_name,
    duplicate,
    forbidden,
    invalid,
    is_c_identifier,
    is_dns_subdomain,
    is_label_name_part,
    is_label_value,
    json_copy,
    required,
    too_long,
    too_many,
    unsupported,
)

# Limits from k8s.io/api/resource/v1/types.go.
DEVICE_REQUESTS_MAX = 32
DEVICE_CONSTRAINTS_MAX = 32
DEVICE_CONFIG_MAX = 32
DEVICE_SELECTORS_MAX = 32
FIRST_AVAILABLE_MAX = 8
DEVICE_TOLERATIONS_MAX = 16
ALLOCATION_RESULTS_MAX = 32
CEL_EXPRESSION_MAX_LENGTH = 10 * 1024
OPAQUE_PARAMETERS_MAX_LENGTH = 10 * 1024
CAPACITY_REQUESTS_MAX = 32

SUPPORTED_VERSIONS = ("v1", "v1beta2", "v1beta1")
API_VERSIONS = tuple(f"{GROUP}/{v}" for v in SUPPORTED_VERSIONS)

ALLOCATION_MODES = ("All", "ExactCount")
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")

# Fields that v1beta1 keeps on the request itself and v1 moves under ``exactly``.
V1BETA1_EXACT_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations",
                         "capacity")


class ClaimConversionError(ObjectInvalid):
    """The object is not a ResourceClaim of a version we convert (``errors`` as for every ObjectInvalid)."""


# ---------------------------------------------------------------------------------------------- conversion

def api_version_of(obj: dict) -> str:
    api_version = obj.get("apiVersion") or f"{GROUP}/v1"
    group, _, version = api_version.rpartition("/")
    if group != GROUP or version not in SUPPORTED_VERSIONS:
        raise ClaimConversionError([("apiVersion", f'Unsupported value: "{api_version}": supported values: '
                                     + ", ".join(f'"{GROUP}/{v}"' for v in SUPPORTED_VERSIONS))])
    return version


def convert_claim_to_v1(obj: dict) -> dict:
    """A ``resource.k8s.io/v1`` copy of a ResourceClaim given in v1, v1beta2 or v1beta1."""
    version = api_version_of(obj)
    if obj.get("kind", "ResourceClaim") != "ResourceClaim":
        raise ClaimConversionError([("kind", f'Unsupported value: "{obj.get("kind")}": supported values: '
                                             '"ResourceClaim"')])
    out = json_copy(obj)
    out["apiVersion"] = f"{GROUP}/v1"
    out["kind"] = "ResourceClaim"
    if version == "v1beta1":
        devices = (out.get("spec") or {}).get("devices")
        if isinstance(devices, dict) and isinstance(devices.get("requests"), list):
            devices["requests"] = [v1beta1_request_to_v1(r) for r in devices["requests"]]
    # v1beta2 and v1 share the spec shape; status allocation results are identical in all three versions
    # for the fields the engine writes.
    return out


def v1beta1_request_to_v1(request: Any) -> Any:
    """One v1beta1 device request in the v1 shape (also used by ``dra.k8s.doctor`` on v1 objects written in
    the v1beta1 shape)."""
    if not isinstance(request, dict):
        return request
    out = {k: v for k, v in request.items() if k not in V1BETA1_EXACT_FIELDS}
    exact = {k: request[k] for k in V1BETA1_EXACT_FIELDS if k in request}
    if request.get("firstAvailable"):
        # v1beta1 validation forbids the exact fields next to firstAvailable; keep them so validation of the
        # converted object reports them instead of silently dropping user input.
        if exact:
            out["exactly"] = exact
    else:
        out["exactly"] = exact
    return out


# ---------------------------------------------------------------------------------------------- defaulting

def default_claim(claim: dict) -> dict:
    """A copy with API server defaults: ``allocationMode: ExactCount``, ``count: 1``, toleration ``Equal``."""
    out = json_copy(claim)
    # Defaulting runs before validation: it skips what has the wrong shape and leaves validation to say so.
    spec = out.get("spec")
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, dict):
        return out
    requests = devices.get("requests")
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _default_exact(request["exactly"])
        first = request.get("firstAvailable")
        for sub in first if isinstance(first, list) else []:
            if isinstance(sub, dict):
                _default_exact(sub)
    return out


def _default_exact(req: dict) -> None:
    if not req.get("allocationMode"):
        req["allocationMode"] = "ExactCount"
    if req["allocationMode"] == "ExactCount" and req.get("count") in (None, 0):
        req["count"] = 1
    tolerations = req.get("tolerations")
    for tol in tolerations if isinstance(tolerations, list) else []:
        if isinstance(tol, dict) and not tol.get("operator"):
            tol["operator"] = "Equal"


# ---------------------------------------------------------------------------------------------- validation

def _bounded_list(value: Any, path: str, limit: int, errors: Errors) -> list:
    """A list field with an upstream item limit: reports a non-list or too many items, returns what to walk."""
    if not isinstance(value, list):
        errors.append(invalid(path, value, "must be a list"))
        return []
    if len(value) > limit:
        errors.append(too_many(path, len(value), limit))
    return value


def check_attribute_name(value: Any, path: str, *, require_domain: bool = False) -> Errors:
    """Attribute and capacity names a claim refers to: ``[domain/]C-identifier`` (``resourceapi.QualifiedName``;
    ``require_domain``: ``FullyQualifiedName``)."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    domain, sep, name = value.rpartition("/")
    if require_domain and not sep:
        return [invalid(path, value, "must include a domain")]
    errors: Errors = []
    if sep:
        if not domain:
            errors.append(invalid(path, value, "the domain must not be empty"))
        elif not is_dns_subdomain(domain, 63):
            errors.append(invalid(path, value, "the domain must be a DNS subdomain of at most 63 characters"))
    if not name:
        errors.append(invalid(path, value, "the name must not be empty"))
    elif not is_c_identifier(name):
        errors.append(invalid(path, value, "the name must be a C identifier (matching regex "
                                           "[A-Za-z_][A-Za-z0-9_]*) of at most 32 characters"))
    return errors


def check_toleration_key(value: str, path: str) -> Errors:
    """A toleration's key: a label key (optional DNS-subdomain prefix, '/', a name part)."""
    prefix, sep, name = value.rpartition("/")
    errors: Errors = []
    if sep and not is_dns_subdomain(prefix):
        errors.append(invalid(path, value, "prefix part a lowercase RFC 1123 subdomain must consist of lower case "
                                           "alphanumeric characters, '-' or '.'"))
    if not is_label_name_part(name):
        errors.append(invalid(path, value, "name part must consist of alphanumeric characters, '-', '_' or '.', "
                                           "and must start and end with an alphanumeric character"))
    return errors


def validate_claim(claim: dict, *, check_cel: bool = True, check_cost: bool | None = None,
                   check_limits: bool | None = None) -> Errors:
    """Field errors of a defaulted v1 ResourceClaim, in upstream wording, in field order.

    ``check_cel`` compiles the selectors and checks their estimated cost; ``check_cost=True``
    with ``check_cel=False`` checks only the cost (compile errors left to the engine).
    ``check_limits`` (default: as ``check_cel``) refuses what the allocator could never satisfy
    (``_validate_device_count``); a simulation leaves that to the engine, in the allocator's words."""
    cel_mode = "all" if check_cel else ("cost" if check_cost else "")
    errors: Errors = []
    if not isinstance(claim, dict):
        return [("", "must be a JSON object")]
    meta = claim.get("metadata")
    if not isinstance(meta, dict):
        errors.append(required("metadata"))
    else:
        name = meta.get("name")
        if not name and not meta.get("generateName"):
            errors.append(required("metadata.name"))
        elif name:
            errors += check_name(name, "metadata.name")
    spec = claim.get("spec")
    if spec is None:
        return errors
    if not isinstance(spec, dict):
        return errors + [invalid("spec", spec, "must be an object")]
    devices = spec.get("devices")
    if devices is None:
        return errors
    if not isinstance(devices, dict):
        return errors + [invalid("spec.devices", devices, "must be an object")]
    _validate_devices(devices, "spec.devices", errors, cel_mode)
    if check_cel if check_limits is None else check_limits:
        _validate_device_count(devices, "spec.devices", errors)
    return errors


def _validate_devices(devices: dict, path: str, errors: Errors, check_cel: bool | str) -> None:
    requests = _bounded_list(devices.get("requests") or [], f"{path}.requests", DEVICE_REQUESTS_MAX, errors)
    request_names: dict[str, set[str]] = {}  # request name -> subrequest names
    for i, request in enumerate(requests):
        _validate_request(request, f"{path}.requests[{i}]", errors, check_cel, request_names)
    constraints = _bounded_list(devices.get("constraints") or [], f"{path}.constraints", DEVICE_CONSTRAINTS_MAX,
                                errors)
    for i, constraint in enumerate(constraints):
        _validate_constraint(constraint, f"{path}.constraints[{i}]", errors, request_names)
    configs = _bounded_list(devices.get("config") or [], f"{path}.config", DEVICE_CONFIG_MAX, errors)
    for i, config in enumerate(configs):
        cpath = f"{path}.config[{i}]"
        if not isinstance(config, dict):
            errors.append(invalid(cpath, config, "must be an object"))
            continue
        errors += _check_refs(config.get("requests") or [], f"{cpath}.requests", request_names)
        _validate_opaque(config.get("opaque"), f"{cpath}.opaque", errors)


def _validate_request(request: Any, rpath: str, errors: Errors, check_cel: bool | str,
                      request_names: dict[str, set[str]]) -> None:
    """One device request; records its name (and its subrequests' names) in ``request_names``."""
    if not isinstance(request, dict):
        errors.append(invalid(rpath, request, "must be an object"))
        return
    name = request.get("name")
    errors += check_name(name, f"{rpath}.name", DNS_LABEL)
    if isinstance(name, str) and name:
        if name in request_names:
            errors.append(duplicate(f"{rpath}.name", name))
        request_names.setdefault(name, set())
    exact = request.get("exactly")
    first = request.get("firstAvailable")
    if exact is not None and first:
        errors.append(forbidden(rpath, "exactly one of `exactly` or `firstAvailable` is required, but multiple "
                                       "fields are set"))
    elif exact is None and not first:
        errors.append(required(rpath, "exactly one of `exactly` or `firstAvailable` is required"))
    if isinstance(exact, dict):
        _validate_exact(exact, f"{rpath}.exactly", errors, check_cel, allow_admin=True)
    elif exact is not None:
        errors.append(invalid(f"{rpath}.exactly", exact, "must be an object"))
    if not first:
        return
    if not isinstance(first, list):
        errors.append(invalid(f"{rpath}.firstAvailable", first, "must be a list"))
        return
    subnames = _validate_subrequests(first, f"{rpath}.firstAvailable", errors, check_cel)
    if isinstance(name, str):
        request_names[name] = subnames


def _validate_subrequests(first: list, path: str, errors: Errors, check_cel: bool | str) -> set[str]:
    """The alternatives of a ``firstAvailable`` request; returns their names."""
    if len(first) > FIRST_AVAILABLE_MAX:
        errors.append(too_many(path, len(first), FIRST_AVAILABLE_MAX))
    subnames: set[str] = set()
    for j, sub in enumerate(first):
        spath = f"{path}[{j}]"
        if not isinstance(sub, dict):
            errors.append(invalid(spath, sub, "must be an object"))
            continue
        sname = sub.get("name")
        errors += check_name(sname, f"{spath}.name", DNS_LABEL)
        if isinstance(sname, str) and sname:
            if sname in subnames:
                errors.append(duplicate(f"{spath}.name", sname))
            subnames.add(sname)
        _validate_exact(sub, spath, errors, check_cel, allow_admin=False)
    return subnames


def _check_refs(refs: Any, path: str, request_names: dict[str, set[str]]) -> Errors:
    """The ``requests`` of a constraint or a config: names of requests (or ``request/subrequest``) here."""
    if not isinstance(refs, list):
        return [invalid(path, refs, "must be a list")]
    errors: Errors = []
    if len(refs) > DEVICE_REQUESTS_MAX:
        errors.append(too_many(path, len(refs), DEVICE_REQUESTS_MAX))
    seen = set()
    for k, ref in enumerate(refs):
        if ref in seen:
            errors.append(duplicate(f"{path}[{k}]", ref))
        seen.add(ref)
        if not isinstance(ref, str) or not _request_ref_exists(ref, request_names):
            errors.append(invalid(f"{path}[{k}]", ref, "must be the name of a request in the claim or the name of "
                                                       "a request and a subrequest separated by '/'"))
    return errors


def _validate_constraint(constraint: Any, cpath: str, errors: Errors, request_names: dict[str, set[str]]) -> None:
    if not isinstance(constraint, dict):
        errors.append(invalid(cpath, constraint, "must be an object"))
        return
    errors += _check_refs(constraint.get("requests") or [], f"{cpath}.requests", request_names)
    match, distinct = constraint.get("matchAttribute"), constraint.get("distinctAttribute")
    if match is not None and distinct is not None:
        errors.append(forbidden(cpath, "exactly one of `matchAttribute` or `distinctAttribute` is required, but "
                                       "multiple fields are set"))
    elif match is None and distinct is None:
        errors.append(required(cpath, "exactly one of `matchAttribute` or `distinctAttribute` is required"))
    if match is not None:
        errors += check_attribute_name(match, f"{cpath}.matchAttribute", require_domain=True)
    if distinct is not None:
        errors += check_attribute_name(distinct, f"{cpath}.distinctAttribute", require_domain=True)


def _exact_count(req) -> int:
    """Devices an ``ExactCount`` request needs (0 when unknown here: ``All``, or invalid)."""
    if not isinstance(req, dict) or req.get("allocationMode") != "ExactCount":
        return 0
    count = req.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def _validate_device_count(devices: dict, path: str, errors: Errors) -> None:
    """Refuse a claim that needs more devices than one allocation can hold.

    Upstream validation accepts it: the allocator fails it at scheduling time ("number of
    requested devices 64 exceeds the claim limit of 32"). We refuse it at creation because it can
    never succeed, and a claim that can never succeed would only keep a worker busy. Counted as
    the allocator counts: an ``exactly`` request's count, a ``firstAvailable`` request's smallest
    alternative; ``All`` depends on the pool and counts 0 here.
    """
    requests = devices.get("requests")
    if not isinstance(requests, list) or len(requests) > DEVICE_REQUESTS_MAX:
        return  # "Too many" is already reported at the same path
    total, reported = 0, False
    for i, request in enumerate(requests):
        if not isinstance(request, dict):
            continue
        first = request.get("firstAvailable")
        if isinstance(first, list) and first:
            counts = [_exact_count(sub) for sub in first]
            need = min(counts)
            where = f"{path}.requests[{i}].firstAvailable[{counts.index(need)}].count"
        else:
            need = _exact_count(request.get("exactly"))
            where = f"{path}.requests[{i}].exactly.count"
        if need > ALLOCATION_RESULTS_MAX:
            errors.append(invalid(where, need, f"{need} exceeds the claim limit of {ALLOCATION_RESULTS_MAX}"))
            reported = True
        total += need
    if total > ALLOCATION_RESULTS_MAX and not reported:
        errors.append(invalid(f"{path}.requests", total, f"the requests need at least {total} devices in total, "
                                                         f"which exceeds the claim limit of {ALLOCATION_RESULTS_MAX}"))


def _request_ref_exists(ref: str, request_names: dict[str, set[str]]) -> bool:
    base, sep, sub = ref.partition("/")
    if base not in request_names:
        return False
    return not sep or sub in request_names[base]


def _validate_opaque(opaque: Any, path: str, errors: Errors) -> None:
    if opaque is None:
        errors.append(required(path))
        return
    if not isinstance(opaque, dict):
        errors.append(invalid(path, opaque, "must be an object"))
        return
    errors += check_name(opaque.get("driver"), f"{path}.driver")
    params = opaque.get("parameters")
    if params is None:
        errors.append(required(f"{path}.parameters"))
    elif not isinstance(params, dict):
        errors.append(invalid(f"{path}.parameters", "<value omitted>", "parameters must be a valid JSON object"))
    elif len(json.dumps(params, separators=(",", ":"))) > OPAQUE_PARAMETERS_MAX_LENGTH:
        errors.append(too_long(f"{path}.parameters", OPAQUE_PARAMETERS_MAX_LENGTH))


def _validate_exact(req: dict, path: str, errors: Errors, check_cel: bool | str, *, allow_admin: bool) -> None:
    errors += check_name(req.get("deviceClassName"), f"{path}.deviceClassName")
    selectors = _bounded_list(req.get("selectors") or [], f"{path}.selectors", DEVICE_SELECTORS_MAX, errors)
    for i, selector in enumerate(selectors):
        validate_selector(selector, f"{path}.selectors[{i}]", errors, check_cel)
    mode = req.get("allocationMode")
    count = req.get("count")
    if mode == "ExactCount":
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            errors.append(invalid(f"{path}.count", count, "must be greater than zero"))
    elif mode == "All":
        if count not in (None, 0):
            errors.append(invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'"))
    elif not mode:
        errors.append(required(f"{path}.allocationMode"))
    else:
        errors.append(unsupported(f"{path}.allocationMode", mode, ALLOCATION_MODES))
    if "adminAccess" in req and req["adminAccess"] is not None:
        if not allow_admin:
            errors.append(forbidden(f"{path}.adminAccess", "not supported for subrequests"))
        elif not isinstance(req["adminAccess"], bool):
            errors.append(invalid(f"{path}.adminAccess", req["adminAccess"], "must be a boolean"))
    tolerations = _bounded_list(req.get("tolerations") or [], f"{path}.tolerations", DEVICE_TOLERATIONS_MAX, errors)
    for i, tol in enumerate(tolerations):
        validate_toleration(tol, f"{path}.tolerations[{i}]", errors)
    capacity = req.get("capacity")
    if capacity is not None:
        _validate_capacity_requests(capacity, f"{path}.capacity", errors)


def validate_selector(selector: Any, path: str, errors: Errors, check_cel: bool | str = True) -> None:
    """``check_cel``: True/"all" compiles and checks the cost, "cost" checks only the cost."""
    if not isinstance(selector, dict):
        errors.append(invalid(path, selector, "must be an object"))
        return
    cel = selector.get("cel")
    if cel is None:
        errors.append(required(f"{path}.cel"))
        return
    expr = cel.get("expression") if isinstance(cel, dict) else None
    epath = f"{path}.cel.expression"
    if not isinstance(expr, str) or not expr:
        errors.append(required(epath))
        return
    if len(expr) > CEL_EXPRESSION_MAX_LENGTH:
        errors.append(too_long(epath, CEL_EXPRESSION_MAX_LENGTH))
        return
    if check_cel:
        try:
            (check_selector_cost if check_cel == "cost" else compile_selector)(expr)
        except CELCostLimitExceeded as exc:
            # Upstream: field.Forbidden "too complex, exceeds cost limit"; ours adds the numbers.
            errors.append(forbidden(epath, exc.reason))
        except CELCompileError as exc:
            errors.append(invalid(epath, expr, f"compilation failed: {exc}"))


def validate_toleration(tol: Any, path: str, errors: Errors) -> None:
    if not isinstance(tol, dict):
        errors.append(invalid(path, tol, "must be an object"))
        return
    key = tol.get("key")
    if key:
        errors += check_toleration_key(key, f"{path}.key")
    op = tol.get("operator") or "Equal"
    if op not in TOLERATION_OPERATORS:
        errors.append(unsupported(f"{path}.operator", op, TOLERATION_OPERATORS))
    value = tol.get("value")
    if op == "Exists" and value:
        errors.append(invalid(f"{path}.operator", op, "value must be empty when `operator` is 'Exists'"))
    elif value and not is_label_value(value):
        errors.append(invalid(f"{path}.value", value, "a valid label must be an empty string or consist of "
                                                      "alphanumeric characters, '-', '_' or '.'"))
    if not key and op != "Exists":
        errors.append(invalid(f"{path}.operator", op, "operator must be Exists when `key` is empty, which means "
                                                      "\"match all values and all keys\""))
    effect = tol.get("effect")
    if effect and effect not in TAINT_EFFECTS:
        errors.append(unsupported(f"{path}.effect", effect, TAINT_EFFECTS))
    seconds = tol.get("tolerationSeconds")
    if seconds is not None and effect != "NoExecute":
        errors.append(invalid(f"{path}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is "
                                                        "set"))


def _validate_capacity_requests(capacity: Any, path: str, errors: Errors) -> None:
    if not isinstance(capacity, dict):
        errors.append(invalid(path, capacity, "must be an object"))
        return
    requests = capacity.get("requests") or {}
    if not isinstance(requests, dict):
        errors.append(invalid(f"{path}.requests", requests, "must be an object"))
        return
    if len(requests) > CAPACITY_REQUESTS_MAX:
        errors.append(too_many(f"{path}.requests", len(requests), CAPACITY_REQUESTS_MAX))
    for name, value in requests.items():
        qpath = f"{path}.requests[{name}]"
        errors += check_attribute_name(name, qpath)
        try:
            if parse_quantity(value) < 0:
                errors.append(invalid(qpath, value, "must be greater than or equal to 0"))
        except QuantityError as exc:
            errors.append(invalid(qpath, value, str(exc)))


def normalize_claim(obj: dict, *, check_cel: bool = True,
                    check_cost: bool | None = None) -> tuple[dict, Errors]:
    """Convert to v1, default, validate: what a create request goes through. Returns (claim, errors)."""
    try:
        claim = convert_claim_to_v1(obj)
    except ClaimConversionError as exc:
        return obj, exc.errors
    claim = default_claim(claim)
    return claim, validate_claim(claim, check_cel=check_cel, check_cost=check_cost)


__all__ = [
    "ALLOCATION_RESULTS_MAX", "DEVICE_REQUESTS_MAX", "DEVICE_CONSTRAINTS_MAX", "DEVICE_CONFIG_MAX",
    "DEVICE_SELECTORS_MAX", "FIRST_AVAILABLE_MAX", "DEVICE_TOLERATIONS_MAX", "ClaimConversionError",
    "V1BETA1_EXACT_FIELDS", "convert_claim_to_v1", "v1beta1_request_to_v1", "default_claim", "validate_claim",
    "normalize_claim",
]
