"""The validation vocabulary of every resource.k8s.io object (and of the service's own API objects).

One shape throughout ``dra.k8s``: a check takes the value first and its field path second. A check of one
field returns its problems, ``check_x(value, path) -> Errors`` (a list of ``(field path, reason)``, upstream's
``field.ErrorList``); a walker of a structure that also normalizes it in place takes the caller's error list
last and returns the normalized value, ``check_x(value, path, errs) -> value``. Pure functions, no Django.

Each kind of name (DNS label, DNS subdomain, C identifier, label key and value) has its pattern, limit and
upstream reason here, once. Three families of objects report a bad name in the words their clients have
always seen, and those are kept (they are part of the API):

* ResourceSlices, DeviceClasses, DeviceTaintRules, Nodes (``check_dns_label`` ...): each problem separately,
  the value quoted Python-style;
* ResourceClaim specs (``check_name``): ``Required value`` or one ``Invalid value`` with the value quoted as
  the API server quotes it (``required``, ``invalid`` ... build upstream's ``field.Error`` types);
* the claims API's own metadata (``name_reason``): the first reason, bare, as upstream's ``IsDNS1123Label``
  returns it.
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

GROUP = "resource.k8s.io"
V1 = f"{GROUP}/v1"
MAX_ID_LENGTH = 32
MAX_POOL_NAME_LENGTH = 253
NODE_SELECTOR_OPERATORS = ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A qualified name's name part; a non-empty label value has the same form.
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

    def prefixed(self, prefix: str) -> ObjectInvalid:
        return ObjectInvalid([(join_path(prefix, p), r) for p, r in self.errors])


def join_path(prefix: str, path: str) -> str:
    """``spec`` + ``devices[0]`` -> ``spec.devices[0]``; ``items[3]`` + ``[name]`` -> ``items[3][name]``."""
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


# --- upstream's field.Error types (value quoted as the API server quotes it) ---------------------------------

def required(path: str, detail: str = "") -> tuple[str, str]:
    return (path, f"Required value: {detail}" if detail else "Required value")


def invalid(path: str, value: Any, detail: str) -> tuple[str, str]:
    return (path, f"Invalid value: {json.dumps(value)}: {detail}")


def forbidden(path: str, detail: str) -> tuple[str, str]:
    return (path, f"Forbidden: {detail}")


def too_many(path: str, actual: int, limit: int) -> tuple[str, str]:
    return (path, f"Too many: {actual}: must have at most {limit} items")


def too_long(path: str, limit: int) -> tuple[str, str]:
    return (path, f"Too long: may not be more than {limit} bytes")


def duplicate(path: str, value: Any) -> tuple[str, str]:
    return (path, f"Duplicate value: {json.dumps(value)}")


def unsupported(path: str, value: Any, supported) -> tuple[str, str]:
    return (path, f"Unsupported value: {json.dumps(value)}: supported values: "
                  + ", ".join(json.dumps(s) for s in supported))


# --- names: one rule per kind, three ways of reporting it -------------------------------------------------

class NameRule(NamedTuple):
    pattern: re.Pattern
    limit: int
    message: str

    def valid(self, value: Any) -> bool:
        return isinstance(value, str) and len(value) <= self.limit and bool(self.pattern.match(value))


DNS_LABEL = NameRule(_DNS_LABEL, 63, DNS_LABEL_MSG)
DNS_SUBDOMAIN = NameRule(_DNS_SUBDOMAIN, 253, DNS_SUBDOMAIN_MSG)


def is_dns_label(value: Any) -> bool:
    return DNS_LABEL.valid(value)


def is_dns_subdomain(value: Any, limit: int = 253) -> bool:
    return isinstance(value, str) and len(value) <= limit and bool(_DNS_SUBDOMAIN.match(value))


def is_c_identifier(value: Any, limit: int = MAX_ID_LENGTH) -> bool:
    return isinstance(value, str) and len(value) <= limit and bool(_C_IDENTIFIER.match(value))


def is_label_name_part(value: Any) -> bool:
    """The name part of a label key, taint key or condition type (after an optional ``prefix/``)."""
    return isinstance(value, str) and 0 < len(value) <= 63 and bool(_LABEL_NAME.match(value))


def is_label_key(value: Any, prefix_limit: int = 253) -> bool:
    """A label key: an optional DNS-subdomain prefix and '/', then a name part."""
    if not isinstance(value, str):
        return False
    prefix, sep, name = value.rpartition("/")
    return is_label_name_part(name) and (not sep or is_dns_subdomain(prefix, prefix_limit))


def is_label_value(value: Any) -> bool:
    return value == "" or is_label_name_part(value)


def check_name(value: Any, path: str, rule: NameRule = DNS_SUBDOMAIN) -> Errors:
    """A required name in a claim spec: ``Required value``, or one ``Invalid value`` whatever is wrong."""
    if not isinstance(value, str) or not value:
        return [required(path)]
    return [] if rule.valid(value) else [invalid(path, value, rule.message)]


def name_reason(value: Any, rule: NameRule) -> str | None:
    """Why the claims API refuses a name in its metadata (None: it does not), upstream's first reason."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > rule.limit:
        return f"must be no more than {rule.limit} characters"
    return None if rule.pattern.match(value) else rule.message


def _check_each(value: Any, path: str, rule: NameRule, limit: int, fold_case: bool = False) -> Errors:
    """ResourceSlice family: a missing name, then its length and its form as separate problems."""
    if not isinstance(value, str) or value == "":
        return [required(path)]
    errs = [] if len(value) <= limit else [(path, _too_long(limit))]
    if not rule.pattern.match(value.lower() if fold_case else value):
        errs.append((path, f"Invalid value: {value!r}: {rule.message}"))
    return errs


def _too_long(limit: int) -> str:
    return f"must have at most {limit} bytes"


def check_dns_label(value: Any, path: str) -> Errors:
    return _check_each(value, path, DNS_LABEL, DNS_LABEL.limit)


def check_dns_subdomain(value: Any, path: str, limit: int = 253) -> Errors:
    return _check_each(value, path, DNS_SUBDOMAIN, limit)


def check_driver_name(value: Any, path: str) -> Errors:
    """Upstream reuses CSI driver name validation: at most 63 characters, a DNS subdomain (case-insensitive)."""
    return _check_each(value, path, DNS_SUBDOMAIN, 63, fold_case=True)


def check_pool_name(value: Any, path: str) -> Errors:
    if not isinstance(value, str) or value == "":
        return [required(path)]
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
    return [(path, reason) for reason in qualified_name_reasons(value)]


@lru_cache(maxsize=4096)
def qualified_name_reasons(value: str) -> tuple[str, ...]:
    """``check_qualified_name``'s reasons, cached: the same few attribute names appear on every device of a
    fleet, and a push checks each device's names on its hot path."""
    parts = value.split("/")
    if len(parts) == 1:
        errs = check_c_identifier(value, "")
    elif len(parts) > 2:
        errs = [("", f"Invalid value: {value!r}: must not contain more than one slash")]
    else:
        errs = [("", "the domain must not be empty")] if not parts[0] else check_driver_name(parts[0], "")
        errs += [("", "the name must not be empty")] if not parts[1] else check_c_identifier(parts[1], "")
    return tuple(reason for _, reason in errs)


def check_label_name(value: Any, path: str) -> Errors:
    """A label key / taint key / condition type: optional DNS-subdomain prefix and a name of at most 63."""
    if not isinstance(value, str) or value == "":
        return [required(path)]
    prefix, _, name = value.rpartition("/")
    errs: Errors = []
    if "/" in value and not prefix:
        errs.append((path, "prefix part must be non-empty"))
    elif prefix:
        errs += [(path, f"prefix part {m}") for _, m in check_dns_subdomain(prefix, path)]
    if not is_label_name_part(name):
        errs.append((path, f"Invalid value: {value!r}: {LABEL_MSG} (at most 63 characters)"))
    return errs


def check_label_value(value: Any, path: str) -> Errors:
    if not isinstance(value, str):
        return [(path, "must be a string")]
    if not is_label_value(value):
        return [(path, f"Invalid value: {value!r}: a valid label value must be an empty string or consist of "
                       "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                       "character (at most 63 characters)")]
    return []


# --- quantities and versions -------------------------------------------------------------------------------

def is_quantity(value: Any) -> bool:
    return isinstance(value, str) and _is_quantity_text(value)


@lru_cache(maxsize=65536)
def _is_quantity_text(value: str) -> bool:
    return bool(_QUANTITY.match(value))


@lru_cache(maxsize=65536)
def is_semver(value: str) -> bool:
    """A version string as semver.org 2.0.0 defines it (a device attribute's ``version``)."""
    return bool(_SEMVER.match(value))


def normalize_quantity(value: Any, path: str, errs: Errors) -> Any:
    """Quantities arrive as strings or JSON numbers (both valid for Kubernetes); store the string form. An
    amount (capacity, counter) is also bounded (``quantity_range_reason``)."""
    if isinstance(value, bool):
        errs.append((path, "must be a quantity"))
        return value
    if isinstance(value, int):
        value = str(value)
    elif isinstance(value, float):
        text = repr(value)
        value = text[:-2] if text.endswith(".0") else text
    if not is_quantity(value):
        errs.append((path, f"Invalid value: {value!r}: must be a quantity (e.g. '80Gi', '100m', '8')"))
        return value
    reason = quantity_range_reason(value)
    if reason:
        errs.append((path, reason))
    return value


# apimachinery's Quantity holds at most 2^63-1 in magnitude (resource.Quantity: "no quantity may represent a
# number greater than 2^63-1"). Upstream caps a larger value silently; an amount of devices or quota that is
# negative or beyond it is a mistake, so it is refused here, naming the field.
MAX_QUANTITY = 2**63 - 1
_EXPONENT_LIMIT = 100  # |exponent| beyond this is out of range (or far below a nano) whatever the digits


@lru_cache(maxsize=65536)
def quantity_range_reason(text: str) -> str | None:
    """Why the quantity ``text`` (already ``is_quantity``) is no amount: negative, or over 2^63-1; else None.
    Bounded work whatever the text: an exponent is looked at before any arithmetic with it."""
    from dra.engine.quantity import QuantityError, parse_quantity

    sign, number = text[:1] if text[:1] in "+-" else "", text.lstrip("+-")
    shown = repr(text) if len(text) <= 40 else repr(text[:24] + "..." + text[-8:])
    if not any(c in "123456789" for c in _mantissa(number)):
        return None  # zero, whatever its sign or suffix
    if sign == "-":
        return f"Invalid value: {shown}: must be greater than or equal to 0"
    exponent = _exponent(number)
    if exponent is not None and abs(exponent) > _EXPONENT_LIMIT:
        # Refused before any arithmetic: 10^-999999999 costs as much to compute as 10^999999999.
        if exponent > 0:
            return f"Invalid value: {shown}: must be less than or equal to {MAX_QUANTITY} (2^63-1)"
        return f"Invalid value: {shown}: the exponent must be between -{_EXPONENT_LIMIT} and {_EXPONENT_LIMIT}"
    try:
        value = parse_quantity(text)
    except QuantityError:
        return f"Invalid value: {shown}: must be a quantity"
    if value > MAX_QUANTITY:
        return f"Invalid value: {shown}: must be less than or equal to {MAX_QUANTITY} (2^63-1)"
    return None


def _mantissa(number: str) -> str:
    for i, c in enumerate(number):
        if not (c.isdigit() or c == "."):
            return number[:i]
    return number


def _exponent(number: str) -> int | None:
    """The decimal exponent written as ``e<n>``/``E<n>`` (not the ``E`` suffix: that is 10^18), or None."""
    rest = number[len(_mantissa(number)):]
    if len(rest) > 1 and rest[0] in "eE" and rest[1:].lstrip("+-").isdigit():
        digits = rest[1:].lstrip("+-")
        if len(digits) > 4:
            return (-1 if rest[1] == "-" else 1) * (10 ** 4)
        return int(rest[1:])
    return None


# --- shapes ------------------------------------------------------------------------------------------------

def as_dict(value: Any, path: str, errs: Errors, required: bool = False) -> dict:
    """``value`` if it is an object, else {} and a problem (None is a problem only when ``required``)."""
    if value is None:
        if required:
            errs.append((path, "Required value"))
        return {}
    if not isinstance(value, dict):
        errs.append((path, "must be an object"))
        return {}
    return value


def as_list(value: Any, path: str, errs: Errors) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        errs.append((path, "must be a list"))
        return []
    return value


def json_copy(value: Any) -> Any:
    """A deep copy of JSON data; the C JSON codec is several times faster than copy.deepcopy here (a claim's
    create spent a third of its CPU in deepcopy). Anything JSON cannot carry is copied the slow way."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return copy.deepcopy(value)


def check_unknown(obj: dict, known: frozenset, path: str, errs: Errors) -> None:
    """Every key of ``obj`` outside ``known`` is an ``unknown field`` (upstream's strict decoding)."""
    for key in obj:
        if key not in known:
            errs.append((join_path(path, str(key)), "unknown field"))


def check_string_list(value: Any, path: str, errs: Errors, limit: int,
                      check: Callable[[Any, str], Errors]) -> list:
    """A list of at most ``limit`` distinct strings, each checked by ``check``."""
    items = as_list(value, path, errs)
    if len(items) > limit:
        errs.append(too_many(path, len(items), limit))
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

def check_envelope(obj: Any, kind: str, versions: set[str], errs: Errors) -> tuple[str, dict, dict]:
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
    metadata = as_dict(obj.get("metadata"), "metadata", errs, required=True)
    return api_version, metadata, as_dict(obj.get("spec"), "spec", errs, required=True)


def normalize_metadata(metadata: dict, errs: Errors) -> dict:
    """Keep what identifies and describes the object; drop server-side bookkeeping (uid, resourceVersion...)."""
    errs += check_dns_subdomain(metadata.get("name"), "metadata.name")
    out: dict = {"name": metadata.get("name")}
    for key in ("labels", "annotations"):
        values = as_dict(metadata.get(key), f"metadata.{key}", errs)
        for k, v in values.items():
            errs += check_label_name(k, f"metadata.{key}[{k}]")
            if key == "labels":
                errs += check_label_value(v, f"metadata.{key}[{k}]")
            elif not isinstance(v, str):
                errs.append((f"metadata.{key}[{k}]", "must be a string"))
        if values:
            out[key] = dict(values)
    return out


def finish_object(kind: str, metadata: dict, spec: dict, errs: Errors) -> dict:
    """The normalized v1 object, or ObjectInvalid with every problem found."""
    if errs:
        raise ObjectInvalid(errs)
    return {"apiVersion": V1, "kind": kind, "metadata": metadata, "spec": spec}


# --- node selectors ----------------------------------------------------------------------------------------

def check_node_selector(value: Any, path: str, errs: Errors) -> dict:
    selector = as_dict(value, path, errs)
    check_unknown(selector, frozenset({"nodeSelectorTerms"}), path, errs)
    terms = as_list(selector.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms", errs)
    if len(terms) != 1:
        errs.append((f"{path}.nodeSelectorTerms", "must have exactly one node selector term"))
    for t, term in enumerate(terms):
        tpath = f"{path}.nodeSelectorTerms[{t}]"
        term = as_dict(term, tpath, errs)
        check_unknown(term, frozenset({"matchExpressions", "matchFields"}), tpath, errs)
        for field in ("matchExpressions", "matchFields"):
            for i, req in enumerate(as_list(term.get(field), f"{tpath}.{field}", errs)):
                _check_selector_requirement(req, f"{tpath}.{field}[{i}]", field, errs)
    return selector


def _check_selector_requirement(value: Any, path: str, field: str, errs: Errors) -> None:
    req = as_dict(value, path, errs)
    if field == "matchFields":
        if req.get("key") != "metadata.name":
            errs.append((f"{path}.key", f"Unsupported value: {req.get('key')!r}: supported values: "
                                        '"metadata.name"'))
    else:
        errs += check_label_name(req.get("key"), f"{path}.key")
    op, values = req.get("operator"), req.get("values") or []
    if op not in NODE_SELECTOR_OPERATORS:
        errs.append((f"{path}.operator", f"Unsupported value: {op!r}: supported values: "
                     + ", ".join(f'"{o}"' for o in NODE_SELECTOR_OPERATORS)))
    elif op in ("In", "NotIn") and not values:
        errs.append((f"{path}.values", "Required value: must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist") and values:
        errs.append((f"{path}.values", "Forbidden: may not be specified when `operator` is 'Exists' or "
                                       "'DoesNotExist'"))
    elif op in ("Gt", "Lt") and (len(values) != 1 or not str(values[0]).lstrip("-").isdigit()):
        errs.append((f"{path}.values", "must be specified single integer value when `operator` is 'Lt' or "
                                       "'Gt'"))


def ts(value: datetime | None) -> str | None:
    """A time as the API server writes one (``metav1.Time``: RFC 3339 in UTC, whole seconds); None stays None."""
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
