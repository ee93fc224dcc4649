"""The claims API's side of ``dra.k8s``: its errors as ``Invalid``, and what only the API needs.

Conversion, defaulting and validation of claims are ``dra.k8s.claims`` (owned by the engine, so that the
simulate endpoint, the worker and this API agree), in the vocabulary of ``dra.k8s.fields``. Here: object
metadata as the claims API takes it (names or generateName, the URL's namespace, labels, annotations),
apiVersion/kind of the claims API's objects, templates, and the rebasing of error paths onto the request body.
"""
from __future__ import annotations

import contextlib
import secrets
from typing import Any

import orjson

from dra.k8s import claims as k8s_claims
from dra.k8s.fields import DNS_LABEL, DNS_SUBDOMAIN, V1, Errors, is_label_name_part, is_label_value, name_reason
from draservice.errors import Invalid

__all__ = ["API_VERSIONS", "V1", "check_dns_label", "check_dns_subdomain", "check_kind", "check_listed_name",
           "check_string_map", "claim_spec_to_v1", "device_class_names", "parse_metadata", "random_suffix",
           "template_spec_to_v1"]

API_VERSIONS = k8s_claims.API_VERSIONS
_RANDOM_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # upstream's generateName alphabet (no vowels, no 0/1/3)


def check_dns_label(value: Any, path: str) -> Errors:
    """A DNS label in the claims API's own objects (namespaces, consumers, gangs), with its first reason."""
    reason = name_reason(value, DNS_LABEL)
    return [(path, reason)] if reason else []


def check_listed_name(value: Any, path: str, seen: set[str]) -> Errors:
    """The ``name`` of an entry in a list of named entries (a consumer's resourceClaims, a gang's members): a DNS
    label, unique in its list. ``seen`` holds the valid names of the entries before it; a valid one joins it."""
    errors = check_dns_label(value, path)
    if errors:
        return errors
    if value in seen:
        return [(path, f'Duplicate value: "{value}"')]
    seen.add(value)
    return []


def check_dns_subdomain(value: Any, path: str) -> Errors:
    reason = name_reason(value, DNS_SUBDOMAIN)
    return [(path, reason)] if reason else []


def check_string_map(value: Any, path: str, *, labels: bool) -> Errors:
    """Labels (``labels=True``) or annotations of a claims API object."""
    errors: Errors = []
    if value is None:
        return errors
    if not isinstance(value, dict):
        return [(path, "must be an object of string keys to string values")]
    total = 0
    for key, val in value.items():
        kpath = f"{path}[{key}]"
        if not isinstance(key, str) or not key:
            errors.append((kpath, "key must be a non-empty string"))
            continue
        prefix, _, name = key.rpartition("/")
        prefix_reason = name_reason(prefix, DNS_SUBDOMAIN) if prefix else None
        if prefix_reason:
            errors.append((kpath, f"prefix part {prefix_reason}"))
        if not is_label_name_part(name):
            errors.append((kpath, "name part must consist of alphanumeric characters, '-', '_' or '.', start and "
                                  "end with an alphanumeric character, and be at most 63 characters"))
        if not isinstance(val, str):
            errors.append((kpath, "value must be a string"))
            continue
        total += len(key) + len(val)
        if labels and not is_label_value(val):
            errors.append((kpath, "a valid label value must be 63 characters or less and consist of "
                                  "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"))
    if not labels and total > 256 * 1024:
        errors.append((path, "total size of annotations must be 256 KiB or less"))
    return errors


def random_suffix(n: int = 5) -> str:
    return "".join(secrets.choice(_RANDOM_ALPHABET) for _ in range(n))


def parse_metadata(obj: dict, path: str = "metadata", *, namespace: str,
                   require_name: bool = True) -> dict:
    """Name (or generateName), labels, annotations; the namespace must match the URL's if given."""
    meta = obj.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise Invalid([(path, "must be an object")])
    errors: Errors = []
    name = meta.get("name")
    generate = meta.get("generateName")
    if not name and generate:
        if not isinstance(generate, str) or name_reason(generate.rstrip("-") or "x", DNS_SUBDOMAIN):
            errors.append((f"{path}.generateName", "must be a valid name prefix"))
        else:
            name = generate[:253 - 5] + random_suffix()
    if not name:
        if require_name:
            errors.append((f"{path}.name", "name or generateName is required"))
    else:
        errors += check_dns_subdomain(name, f"{path}.name")
    ns = meta.get("namespace")
    if ns not in (None, "", namespace):
        errors.append((f"{path}.namespace", f"does not match the namespace in the URL ({namespace!r})"))
    errors += check_string_map(meta.get("labels"), f"{path}.labels", labels=True)
    errors += check_string_map(meta.get("annotations"), f"{path}.annotations", labels=False)
    if errors:
        raise Invalid(errors)
    return {"name": name, "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {})}


def check_kind(obj: Any, kind: str, path: str = "") -> str:
    """The object's apiVersion (one of ours); ``kind`` must match when given."""
    prefix = f"{path}." if path else ""
    if not isinstance(obj, dict):
        raise Invalid([(path, f"must be a {kind} object")])
    api_version = obj.get("apiVersion") or V1
    errors = []
    if api_version not in API_VERSIONS:
        errors.append((f"{prefix}apiVersion", f"must be one of {', '.join(API_VERSIONS)}"))
    if obj.get("kind") not in (None, "", kind):
        errors.append((f"{prefix}kind", f"must be {kind}"))
    if errors:
        raise Invalid(errors)
    return api_version


def claim_spec_to_v1(spec: Any, api_version: str, path: str) -> dict:
    """Convert, default and validate a ResourceClaimSpec with ``dra.k8s.claims``; the normalized v1 spec.

    Raises Invalid whose paths are relative to the request body (``path`` is where the spec sits in it).
    The outcome is kept per spec as sent (``_SPEC_MEMO``): a pipeline submits the same spec over and over, and
    converting and validating it (its selectors compiled) was most of a claim POST's own work. Each caller gets a
    spec of its own.
    """
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise Invalid([(path, "must be an object")])
    try:
        key: bytes | None = api_version.encode() + b"\0" + orjson.dumps(spec)
    except (orjson.JSONEncodeError, TypeError, AttributeError):  # what JSON does not hold (an int over 64 bits)
        key = None
    hit = _SPEC_MEMO.get(key) if key is not None else None
    if hit is None:
        claim = {"apiVersion": api_version, "kind": "ResourceClaim", "metadata": {"name": "x"}, "spec": spec}
        v1, errors = k8s_claims.normalize_claim(claim)
        out = {} if errors else (v1.get("spec") or {})
        if key is not None:
            if len(_SPEC_MEMO) >= SPEC_MEMO_MAX:
                _SPEC_MEMO.clear()
            with contextlib.suppress(orjson.JSONEncodeError, TypeError):
                _SPEC_MEMO[key] = (b"" if errors else orjson.dumps(out), errors)
    else:
        encoded, errors = hit
        out = {} if errors else orjson.loads(encoded)
    if errors:
        raise Invalid([_rebase(field, reason, path) for field, reason in errors])
    return out


SPEC_MEMO_MAX = 4096
_SPEC_MEMO: dict[bytes, tuple[bytes, Errors]] = {}  # api version + spec as sent -> (v1 spec, errors)


def _rebase(field: str, reason: str, path: str) -> tuple[str, str]:
    """Engine paths start at ``spec``; ours at wherever the spec sits in the request body."""
    if field == "spec":
        return path, reason
    if field.startswith("spec."):
        return f"{path}{field[4:]}", reason
    return (f"{path}.{field}" if field and path else field or path), reason


def template_spec_to_v1(spec: Any, api_version: str, path: str) -> dict:
    """A ResourceClaimTemplateSpec: ``{metadata: {labels, annotations}, spec: <claim spec>}``."""
    if not isinstance(spec, dict):
        raise Invalid([(path, "must be an object")])
    meta = spec.get("metadata") or {}
    if not isinstance(meta, dict):
        raise Invalid([(f"{path}.metadata", "must be an object")])
    errors = check_string_map(meta.get("labels"), f"{path}.metadata.labels", labels=True)
    errors += check_string_map(meta.get("annotations"), f"{path}.metadata.annotations", labels=False)
    if errors:
        raise Invalid(errors)
    claim_spec = claim_spec_to_v1(spec.get("spec"), api_version, f"{path}.spec")
    out_meta = {k: dict(meta[k]) for k in ("labels", "annotations") if meta.get(k)}
    return {"metadata": out_meta, "spec": claim_spec}


def device_class_names(spec: dict) -> list[tuple[str, str]]:
    """(field path under spec, class name) of every request and subrequest."""
    out = []
    for i, req in enumerate((spec.get("devices") or {}).get("requests") or []):
        if req.get("exactly"):
            out.append((f"devices.requests[{i}].exactly.deviceClassName", req["exactly"].get("deviceClassName")))
        for j, sub in enumerate(req.get("firstAvailable") or []):
            out.append((f"devices.requests[{i}].firstAvailable[{j}].deviceClassName", sub.get("deviceClassName")))
    return out
