"""Field-level validation shared by the resource.k8s.io objects: names, labels, quantities, node selectors,
and the error type. Pure functions, no Django; messages follow upstream's apimachinery validation.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Callable

GROUP = "resource.k8s.io"
V1 = f"{GROUP}/v1"
MAX_ID_LENGTH = 32
MAX_POOL_NAME_LENGTH = 253
NODE_SELECTOR_OPERATORS = ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
# resource.Quantity: sign, digits with optional fraction, then a binary SI suffix, a decimal SI suffix or
# a decimal exponent.
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")

DNS_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                 "start and end with an alphanumeric character")
DNS_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                     "'.', and must start and end with an alphanumeric character")
C_IDENTIFIER_MSG = ("a valid C identifier must start with alphabetic character or '_', followed by a string of "
                    "alphanumeric characters or '_'")
LABEL_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character")

Errors = list[tuple[str, str]]


class ObjectInvalid(ValueError):
    """A Kubernetes object failed conversion or validation; ``errors`` is a list of (field path, reason)."""

    def __init__(self, errors: Errors):
        self.errors = errors
        super().__init__("; ".join(f"{p}: {r}" if p else r for p, r in errors))

    def prefixed(self, prefix: str) -> "ObjectInvalid":
        return ObjectInvalid([(_join(prefix, p), r) for p, r in self.errors])


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


# --- names -------------------------------------------------------------------------------------------------

def is_dns_label(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))


def _too_long(limit: int) -> str:
    return f"must have at most {limit} bytes"


def check_dns_label(value: Any, path: str) -> Errors:
    if not isinstance(value, str) or value == "":
        return [(path, "Required value")]
    errs = [] if len(value) <= 63 else [(path, _too_long(63))]
    if not _DNS_LABEL.match(value):
        errs.append((path, f"Invalid value: {value!r}: {DNS_LABEL_MSG}"))
    return errs


def check_dns_subdomain(value: Any, path: str, limit: int = 253) -> Errors:
    if not isinstance(value, str) or value == "":
        return [(path, "Required value")]
    errs = [] if len(value) <= limit else [(path, _too_long(limit))]
    if not _DNS_SUBDOMAIN.match(value):
        errs.append((path, f"Invalid value: {value!r}: {DNS_SUBDOMAIN_MSG}"))
    return errs


def check_driver_name(value: Any, path: str) -> Errors:
    """Upstream reuses CSI driver name validation: at most 63 characters, a DNS subdomain (case-insensitive)."""
    if not isinstance(value, str) or value == "":
        return [(path, "Required value")]
    errs = [] if len(value) <= 63 else [(path, _too_long(63))]
    if not _DNS_SUBDOMAIN.match(value.lower()):
        errs.append((path, f"Invalid value: {value!r}: {DNS_SUBDOMAIN_MSG}"))
    return errs


def check_pool_name(value: Any, path: str) -> Errors:
    if not isinstance(value, str) or value == "":
        return [(path, "Required value")]
    errs = [] if len(value) <= MAX_POOL_NAME_LENGTH else [(path, _too_long(MAX_POOL_NAME_LENGTH))]
    for part in value.split("/"):
        errs += check_dns_subdomain(part, path)
    return errs


def check_c_identifier(value: str, path: str) -> Errors:
    errs = [] if len(value) <= MAX_ID_LENGTH else [(path, _too_long(MAX_ID_LENGTH))]
    if not _C_IDENTIFIER.match(value):
        errs.append((path, f"Invalid value: {value!r}: {C_IDENTIFIER_MSG}"))
    return errs


def check_qualified_name(value: str, path: str) -> Errors:
    """An attribute/capacity name: a C identifier, or a driver-style domain, '/', and a C identifier."""
    return [(path, reason) for reason in _qualified_name_reasons(value)]


@lru_cache(maxsize=4096)
def _qualified_name_reasons(value: str) -> tuple[str, ...]:
    # The same few attribute names appear on every device of a fleet: check each once.
    return tuple(reason for _, reason in _check_qualified_name(value, ""))


def _check_qualified_name(value: str, path: str) -> Errors:
    parts = value.split("/")
    if len(parts) == 1:
        return check_c_identifier(value, path)
    if len(parts) > 2:
        return [(path, f"Invalid value: {value!r}: must not contain more than one slash")]
    errs: Errors = []
    errs += [(path, "the domain must not be empty")] if not parts[0] else check_driver_name(parts[0], path)
    errs += [(path, "the name must not be empty")] if not parts[1] else check_c_identifier(parts[1], path)
    return errs


def check_label_name(value: Any, path: str) -> Errors:
    """A label key / taint key / condition type: optional DNS-subdomain prefix and a name of at most 63."""
    if not isinstance(value, str) or value == "":
        return [(path, "Required value")]
    prefix, _, name = value.rpartition("/")
    errs: Errors = []
    if "/" in value and not prefix:
        errs.append((path, "prefix part must be non-empty"))
    elif prefix:
        errs += [(path, f"prefix part {m}") for _, m in check_dns_subdomain(prefix, path)]
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        errs.append((path, f"Invalid value: {value!r}: {LABEL_MSG} (at most 63 characters)"))
    return errs


def check_label_value(value: Any, path: str) -> Errors:
    if not isinstance(value, str):
        return [(path, "must be a string")]
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return [(path, f"Invalid value: {value!r}: a valid label value must be an empty string or consist of "
                       "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                       "character (at most 63 characters)")]
    return []


def is_quantity(value: Any) -> bool:
    return isinstance(value, str) and _is_quantity_text(value)


@lru_cache(maxsize=65536)
def _is_quantity_text(value: str) -> bool:
    return bool(_QUANTITY.match(value))


def _quantity(value: Any, path: str, errs: Errors) -> Any:
    """Quantities arrive as strings or JSON numbers (both valid for Kubernetes); store the string form."""
    if isinstance(value, bool):
        errs.append((path, "must be a quantity"))
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if not is_quantity(value):
        errs.append((path, f"Invalid value: {value!r}: must be a quantity (e.g. '80Gi', '100m', '8')"))
    return value


# --- small type helpers ------------------------------------------------------------------------------------

def _dict(value: Any, path: str, errs: Errors, required: bool = False) -> dict:
    if value is None:
        if required:
            errs.append((path, "Required value"))
        return {}
    if not isinstance(value, dict):
        errs.append((path, "must be an object"))
        return {}
    return value


def _list(value: Any, path: str, errs: Errors) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        errs.append((path, "must be a list"))
        return []
    return value


def _copy(value: Any) -> Any:
    """A deep copy of JSON data; the C JSON codec is several times faster than copy.deepcopy here."""
    return json.loads(json.dumps(value))


def _unknown(obj: dict, known: frozenset, path: str, errs: Errors) -> None:
    for key in obj:
        if key not in known:
            errs.append((_join(path, str(key)), "unknown field"))


def _string_list(value: Any, path: str, errs: Errors, limit: int, check: Callable[[Any, str], Errors]) -> list:
    items = _list(value, path, errs)
    if len(items) > limit:
        errs.append((path, f"Too many: {len(items)}: must have at most {limit} items"))
        return items
    seen = set()
    for i, item in enumerate(items):
        errs += check(item, f"{path}[{i}]")
        if isinstance(item, str):
            if item in seen:
                errs.append((f"{path}[{i}]", f"Duplicate value: {item!r}"))
            seen.add(item)
    return items


# --- envelope ----------------------------------------------------------------------------------------------

def _envelope(obj: Any, kind: str, versions: set[str], errs: Errors) -> tuple[str, dict, dict]:
    """Check apiVersion/kind; return (apiVersion, metadata, spec). Missing apiVersion means v1."""
    if not isinstance(obj, dict):
        errs.append(("", f"must be a {kind} object"))
        return V1, {}, {}
    api_version = obj.get("apiVersion") or V1
    if not isinstance(api_version, str):  # a list or an object is not hashable: check before the set lookup
        errs.append(("apiVersion", f"Invalid value: {type(api_version).__name__}: must be a string"))
        api_version = V1
    elif api_version not in versions:
        errs.append(("apiVersion", f"Unsupported value: {api_version!r}: supported values: "
                                   + ", ".join(f'"{v}"' for v in sorted(versions))))
    if obj.get("kind", kind) != kind:
        errs.append(("kind", f"Invalid value: {obj.get('kind')!r}: expected {kind!r}"))
    metadata = _dict(obj.get("metadata"), "metadata", errs, required=True)
    return api_version, metadata, _dict(obj.get("spec"), "spec", errs, required=True)


def _metadata(metadata: dict, errs: Errors) -> dict:
    """Keep what identifies and describes the object; drop server-side bookkeeping (uid, resourceVersion...)."""
    errs += check_dns_subdomain(metadata.get("name"), "metadata.name")
    out: dict = {"name": metadata.get("name")}
    for key in ("labels", "annotations"):
        values = _dict(metadata.get(key), f"metadata.{key}", errs)
        for k, v in values.items():
            errs += check_label_name(k, f"metadata.{key}[{k}]")
            if key == "labels":
                errs += check_label_value(v, f"metadata.{key}[{k}]")
            elif not isinstance(v, str):
                errs.append((f"metadata.{key}[{k}]", "must be a string"))
        if values:
            out[key] = dict(values)
    return out


def _finish(kind: str, metadata: dict, spec: dict, errs: Errors) -> dict:
    if errs:
        raise ObjectInvalid(errs)
    return {"apiVersion": V1, "kind": kind, "metadata": metadata, "spec": spec}


# --- node selectors ----------------------------------------------------------------------------------------

def check_node_selector(value: Any, path: str, errs: Errors) -> dict:
    selector = _dict(value, path, errs)
    _unknown(selector, frozenset({"nodeSelectorTerms"}), path, errs)
    terms = _list(selector.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms", errs)
    if len(terms) != 1:
        errs.append((f"{path}.nodeSelectorTerms", "must have exactly one node selector term"))
    for t, term in enumerate(terms):
        tpath = f"{path}.nodeSelectorTerms[{t}]"
        term = _dict(term, tpath, errs)
        _unknown(term, frozenset({"matchExpressions", "matchFields"}), tpath, errs)
        for field in ("matchExpressions", "matchFields"):
            for i, req in enumerate(_list(term.get(field), f"{tpath}.{field}", errs)):
                rpath = f"{tpath}.{field}[{i}]"
                req = _dict(req, rpath, errs)
                if field == "matchFields":
                    if req.get("key") != "metadata.name":
                        errs.append((f"{rpath}.key", f"Unsupported value: {req.get('key')!r}: supported values: "
                                                     '"metadata.name"'))
                else:
                    errs += check_label_name(req.get("key"), f"{rpath}.key")
                op, values = req.get("operator"), req.get("values") or []
                if op not in NODE_SELECTOR_OPERATORS:
                    errs.append((f"{rpath}.operator", f"Unsupported value: {op!r}: supported values: "
                                 + ", ".join(f'"{o}"' for o in NODE_SELECTOR_OPERATORS)))
                elif op in ("In", "NotIn") and not values:
                    errs.append((f"{rpath}.values", "Required value: must be specified when `operator` is 'In' "
                                                    "or 'NotIn'"))
                elif op in ("Exists", "DoesNotExist") and values:
                    errs.append((f"{rpath}.values", "Forbidden: may not be specified when `operator` is 'Exists' "
                                                    "or 'DoesNotExist'"))
                elif op in ("Gt", "Lt") and (len(values) != 1 or not str(values[0]).lstrip("-").isdigit()):
                    errs.append((f"{rpath}.values", "must be specified single integer value when `operator` is "
                                                    "'Lt' or 'Gt'"))
    return selector
