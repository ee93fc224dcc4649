"""The ``Queue`` object (``draservice.io/v1alpha1``): parsing, defaulting and validation of one object.

Pure checks of the object itself live here (field paths in Kubernetes style); checks against other queues
(a cycle, a missing parent, a namespace another queue lists) are ``queues.services.queues``'s, under its lock.
"""
from __future__ import annotations

import copy
from typing import Any

from dra.engine.quantity import QuantityError, parse_quantity
from dra.k8s import fields as f
from draservice import webhooks
from queues.models import API_VERSION, KIND

UNITS = ("devices", "counters", "capacity")
LIMITS = ("nominal", "borrowingLimit", "lendingLimit")
WITHIN_QUEUE = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM_WITHIN_COHORT = ("Never", "LowerPriority", "Any")
# The field reclaimWithinCohort replaced, still accepted on input (never returned): its values in the new terms.
RECLAIM_BORROWED = {"Never": "Never", "Always": "Any"}
BORROW_WITHIN_COHORT = ("Never", "LowerPriority")
PREEMPTION_STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
DEFAULT_PLAN_DEPTH = 10
MAX_PLAN_DEPTH = 100
SPEC_FIELDS = ("parent", "namespaces", "quotas", "weight", "priority", "maxPriority", "preemption", "fairSharing",
               "planDepth")
MAX_HALF_LIFE = 365 * 86400  # a year: longer remembers use nobody can still account for
PREEMPTION_DEFAULTS = {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any",
                       "borrowWithinCohort": {"policy": "Never"}, "minRuntimeSeconds": 0, "graceSeconds": 30}
# forceAfterSeconds has no fixed default (graceSeconds'); webhook none at all.
PREEMPTION_FIELDS = (*PREEMPTION_DEFAULTS, "forceAfterSeconds", "webhook", "reclaimBorrowed")
MAX_QUOTAS = 64
MAX_NAMESPACES = 1024


def header(body: dict, kind: str, url_name: str | None) -> tuple[str | None, Any, Any, list[tuple[str, str]]]:
    """(name, labels, annotations, field errors) of a fleet-wide draservice.io object's apiVersion, kind and
    metadata (a Queue's, a Reservation's): the name a DNS label matching the URL's, maps of strings."""
    errors: list[tuple[str, str]] = []
    if body.get("apiVersion", API_VERSION) != API_VERSION:
        errors.append(f.unsupported("apiVersion", body.get("apiVersion"), [API_VERSION]))
    if body.get("kind", kind) != kind:
        errors.append(f.unsupported("kind", body.get("kind"), [kind]))
    meta = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    name = meta.get("name") or url_name
    if not name:
        errors.append(f.required("metadata.name"))
    else:
        errors += f.check_dns_label(name, "metadata.name")
        if url_name and name != url_name:
            errors.append(f.invalid("metadata.name", name, f"must match the name in the URL ({url_name!r})"))
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    for key, value in (("metadata.labels", labels), ("metadata.annotations", annotations)):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            errors.append(f.invalid(key, value, "must be a map of strings"))
    return name, labels, annotations, errors


def normalize(body: Any, url_name: str | None = None) -> tuple[dict, list[tuple[str, str]]]:
    """(normalized object, field errors). The object is ``{apiVersion, kind, metadata, spec}`` with defaults."""
    if not isinstance(body, dict):
        return {}, [("", "must be a Queue object")]
    name, labels, annotations, errors = header(body, KIND, url_name)
    raw = body.get("spec", {})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return {}, errors + [f.invalid("spec", raw, "must be an object")]
    spec, spec_errors = _spec(raw)
    obj = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": name or "", "labels": labels if isinstance(labels, dict) else {},
                        "annotations": annotations if isinstance(annotations, dict) else {}},
           "spec": spec}
    return obj, errors + spec_errors


def _spec(raw: dict) -> tuple[dict, list[tuple[str, str]]]:
    errors: list[tuple[str, str]] = []
    for key in raw:
        if key not in SPEC_FIELDS:
            errors.append(f.unsupported(f"spec.{key}", key, SPEC_FIELDS))
    spec: dict[str, Any] = {}
    parent = raw.get("parent")
    if parent not in (None, ""):
        errors += f.check_dns_label(parent, "spec.parent")
        spec["parent"] = parent
    namespaces = raw.get("namespaces") or []
    if not isinstance(namespaces, list):
        errors.append(f.invalid("spec.namespaces", namespaces, "must be a list of namespace names"))
        namespaces = []
    elif len(namespaces) > MAX_NAMESPACES:
        errors.append(f.too_many("spec.namespaces", len(namespaces), MAX_NAMESPACES))
    seen: set[str] = set()
    for i, ns in enumerate(namespaces):
        errors += f.check_dns_label(ns, f"spec.namespaces[{i}]")
        if ns in seen:
            errors.append(f.duplicate(f"spec.namespaces[{i}]", ns))
        seen.add(ns) if isinstance(ns, str) else None
    spec["namespaces"] = [n for n in namespaces if isinstance(n, str)]
    quotas = raw.get("quotas") or []
    if not isinstance(quotas, list):
        errors.append(f.invalid("spec.quotas", quotas, "must be a list"))
        quotas = []
    elif len(quotas) > MAX_QUOTAS:
        errors.append(f.too_many("spec.quotas", len(quotas), MAX_QUOTAS))
    spec["quotas"] = []
    keys: set[tuple] = set()
    for i, q in enumerate(quotas):
        entry, entry_errors = _quota(q, f"spec.quotas[{i}]")
        errors += entry_errors
        key = (entry.get("deviceClassName"), repr(entry.get("clusterSelector")))
        if entry.get("deviceClassName") and key in keys:
            errors.append(f.duplicate(f"spec.quotas[{i}].deviceClassName", entry["deviceClassName"]))
        keys.add(key)
        spec["quotas"].append(entry)
    spec["weight"] = _number(raw, "weight", 1, errors, positive=True)
    spec["priority"] = _integer(raw, "priority", 0, errors, minimum=None)
    spec["maxPriority"] = _integer(raw, "maxPriority", 0, errors, minimum=0)
    spec["preemption"] = _preemption(raw.get("preemption"), errors)
    if raw.get("fairSharing") is not None:
        spec["fairSharing"] = _fair_sharing(raw["fairSharing"], errors)
        _fair_weight(raw, spec, errors)
    # How many of its first pending claims the plan gives a start (scheduler.services.plan); 0: none.
    spec["planDepth"] = _integer(raw, "planDepth", DEFAULT_PLAN_DEPTH, errors, minimum=0)
    if spec["planDepth"] > MAX_PLAN_DEPTH:
        errors.append(f.invalid("spec.planDepth", spec["planDepth"], f"must be at most {MAX_PLAN_DEPTH}"))
        spec["planDepth"] = DEFAULT_PLAN_DEPTH
    return spec, errors


def half_life(spec: dict) -> int:
    """``spec.fairSharing.halfLifeSeconds`` (0: past use does not count)."""
    return int((spec.get("fairSharing") or {}).get("halfLifeSeconds") or 0)


def preemption_strategies(spec: dict) -> list[str]:
    """``spec.fairSharing.preemptionStrategies``, in the order they are tried ([]: no fair-share preemption)."""
    return list((spec.get("fairSharing") or {}).get("preemptionStrategies") or [])


def _fair_weight(raw: dict, spec: dict, errors: list) -> None:
    """``fairSharing.weight`` (Kueue's place for it) is ``spec.weight``: either may be given; both, equal."""
    fair = raw["fairSharing"] if isinstance(raw["fairSharing"], dict) else {}
    if "weight" not in fair:
        return
    weight = _number(fair, "weight", 1, errors, positive=True, path="spec.fairSharing")
    if "weight" in raw and raw["weight"] != fair["weight"]:
        errors.append(f.invalid("spec.fairSharing.weight", fair["weight"],
                                f"must equal spec.weight ({raw['weight']}) when both are given"))
    spec["weight"] = spec["fairSharing"]["weight"] = weight


def _fair_sharing(raw: Any, errors: list) -> dict:
    if not isinstance(raw, dict):
        errors.append(f.invalid("spec.fairSharing", raw, "must be an object"))
        return {}
    allowed = ("halfLifeSeconds", "preemptionStrategies", "weight")
    for key in raw:
        if key not in allowed:
            errors.append(f.unsupported(f"spec.fairSharing.{key}", key, allowed))
    out: dict = {"halfLifeSeconds": 0}
    value = raw.get("halfLifeSeconds", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HALF_LIFE:
        errors.append(f.invalid("spec.fairSharing.halfLifeSeconds", value,
                                f"must be an integer from 0 to {MAX_HALF_LIFE} (seconds)"))
    else:
        out["halfLifeSeconds"] = value
    strategies = raw.get("preemptionStrategies")
    if strategies is not None:
        path = "spec.fairSharing.preemptionStrategies"
        if not isinstance(strategies, list) or len(strategies) > len(PREEMPTION_STRATEGIES):
            errors.append(f.invalid(path, strategies, f"must be a list of at most {len(PREEMPTION_STRATEGIES)} "
                                                      "strategies"))
        else:
            for i, name in enumerate(strategies):
                if name not in PREEMPTION_STRATEGIES:
                    errors.append(f.unsupported(f"{path}[{i}]", name, PREEMPTION_STRATEGIES))
                elif name in strategies[:i]:
                    errors.append(f.duplicate(f"{path}[{i}]", name))
            out["preemptionStrategies"] = [s for s in strategies if s in PREEMPTION_STRATEGIES]
    return out


def _quota(q: Any, path: str) -> tuple[dict, list[tuple[str, str]]]:
    if not isinstance(q, dict):
        return {}, [f.invalid(path, q, "must be an object")]
    errors: list[tuple[str, str]] = []
    allowed = ("deviceClassName", "clusterSelector", *UNITS)
    for key in q:
        if key not in allowed:
            errors.append(f.unsupported(f"{path}.{key}", key, allowed))
    entry: dict[str, Any] = {}
    cls = q.get("deviceClassName")
    if not cls:
        errors.append(f.required(f"{path}.deviceClassName", "every quota names the DeviceClass it covers"))
    else:
        errors += f.check_dns_subdomain(cls, f"{path}.deviceClassName")
        entry["deviceClassName"] = cls
    selector = q.get("clusterSelector")
    if selector is not None:
        labels = selector.get("matchLabels") if isinstance(selector, dict) else None
        if not isinstance(labels, dict) or set(selector) - {"matchLabels"} or \
                not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            errors.append(f.invalid(f"{path}.clusterSelector", selector, "must be {matchLabels: {label: value}}"))
        else:
            entry["clusterSelector"] = {"matchLabels": dict(labels)}
    if not any(u in q for u in UNITS):
        errors.append(f.required(path, "a quota gives at least one of devices, counters, capacity"))
    if "devices" in q:
        entry["devices"] = _limits(q["devices"], f"{path}.devices", errors, integer=True)
    for unit in ("counters", "capacity"):
        if unit in q:
            named = q[unit]
            if not isinstance(named, dict) or not named:
                errors.append(f.invalid(f"{path}.{unit}", named, "must map a name to {nominal, borrowingLimit, "
                                                                  "lendingLimit}"))
                continue
            entry[unit] = {}
            for name, limits in named.items():
                if not isinstance(name, str) or not name:
                    errors.append(f.invalid(f"{path}.{unit}", name, "names must be non-empty strings"))
                    continue
                entry[unit][name] = _limits(limits, f"{path}.{unit}[{name}]", errors, integer=False)
    return entry, errors


def _limits(raw: Any, path: str, errors: list, integer: bool) -> dict:
    if not isinstance(raw, dict):
        errors.append(f.invalid(path, raw, "must be {nominal, borrowingLimit, lendingLimit}"))
        return {}
    out: dict[str, Any] = {}
    for key in raw:
        if key not in LIMITS:
            errors.append(f.unsupported(f"{path}.{key}", key, LIMITS))
    if "nominal" not in raw:
        errors.append(f.required(f"{path}.nominal"))
    for key in LIMITS:
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        # Bounded before any arithmetic: a 41-digit "Ei" (or "1e999999999") is no quota.
        reason = f.quantity_range_reason(value) if f.is_quantity(value) else None
        if reason is None and isinstance(value, int) and not isinstance(value, bool) and value > f.MAX_QUANTITY:
            reason = f.invalid(f"{path}.{key}", value, f"must be less than or equal to {f.MAX_QUANTITY}")[1]
        if reason is not None:
            errors.append((f"{path}.{key}", reason))
            continue
        amount = amount_of(value)
        if amount is None or (integer and (isinstance(value, bool) or not isinstance(value, int))):
            errors.append(f.invalid(f"{path}.{key}", value, "must be a non-negative integer" if integer
                                    else "must be a non-negative quantity (e.g. 160Gi)"))
        elif amount < 0:
            errors.append(f.invalid(f"{path}.{key}", value, "must be greater than or equal to 0"))
        else:
            out[key] = value
    if "lendingLimit" in out and "nominal" in out and amount_of(out["lendingLimit"]) > amount_of(out["nominal"]):
        errors.append(f.invalid(f"{path}.lendingLimit", out["lendingLimit"], "must not exceed nominal"))
    return out


def amount_of(value: Any):
    """A limit as an exact number (int or Fraction), or None when it is not a quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return parse_quantity(value)
        except (QuantityError, TypeError):
            return None
    return None


def _number(raw: dict, key: str, default, errors: list, positive: bool = False, path: str = "spec"):
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        errors.append(f.invalid(f"{path}.{key}", value, "must be a number greater than 0"))
        return default
    return value


def _integer(raw: dict, key: str, default: int, errors: list, minimum: int | None) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        errors.append(f.invalid(f"spec.{key}", value, "must be an integer" +
                                (f" greater than or equal to {minimum}" if minimum is not None else "")))
        return default
    return value


def _preemption(raw: Any, errors: list) -> dict:
    if raw is None:
        return copy.deepcopy(PREEMPTION_DEFAULTS)
    if not isinstance(raw, dict):
        errors.append(f.invalid("spec.preemption", raw, "must be an object"))
        return copy.deepcopy(PREEMPTION_DEFAULTS)
    allowed = PREEMPTION_FIELDS
    for key in raw:
        if key not in allowed:
            errors.append(f.unsupported(f"spec.preemption.{key}", key, allowed))
    out = copy.deepcopy(PREEMPTION_DEFAULTS)
    _reclaim_borrowed(raw, out, errors)
    for key, choices in (("withinQueue", WITHIN_QUEUE), ("reclaimWithinCohort", RECLAIM_WITHIN_COHORT)):
        if key in raw:
            if raw[key] not in choices:
                errors.append(f.unsupported(f"spec.preemption.{key}", raw[key], choices))
            else:
                out[key] = raw[key]
    if raw.get("borrowWithinCohort") is not None:
        out["borrowWithinCohort"] = _borrow_within_cohort(raw["borrowWithinCohort"], errors)
    for key in ("minRuntimeSeconds", "graceSeconds"):
        value = raw.get(key, out[key])
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            errors.append(f.invalid(f"spec.preemption.{key}", value, "must be an integer greater than or equal to 0"))
        else:
            out[key] = value
    # When the devices move at the latest if the victim never confirms that it stopped; unset, graceSeconds
    # (not stored: a queue that changes its graceSeconds keeps forcing at it).
    force = raw.get("forceAfterSeconds")
    if force is not None:
        grace = out["graceSeconds"]
        if isinstance(force, bool) or not isinstance(force, int) or (isinstance(grace, int) and force < grace):
            words = f"must be an integer greater than or equal to graceSeconds ({out['graceSeconds']})"
            errors.append(f.invalid("spec.preemption.forceAfterSeconds", force, words))
        else:
            out["forceAfterSeconds"] = force
    if raw.get("webhook") is not None:
        out["webhook"] = _webhook(raw["webhook"], errors)
    return out


def _reclaim_borrowed(raw: dict, out: dict, errors: list) -> None:
    """The old ``reclaimBorrowed`` (Never | Always), read as ``reclaimWithinCohort`` (Never | Any); given with
    the new field, the two must agree."""
    if "reclaimBorrowed" not in raw:
        return
    old = raw["reclaimBorrowed"]
    if old not in RECLAIM_BORROWED:
        errors.append(f.unsupported("spec.preemption.reclaimBorrowed", old, tuple(RECLAIM_BORROWED)))
    elif "reclaimWithinCohort" in raw and raw["reclaimWithinCohort"] != RECLAIM_BORROWED[old]:
        errors.append(f.invalid("spec.preemption.reclaimBorrowed", old,
                                f"is replaced by reclaimWithinCohort and disagrees with it: {old} means "
                                f"reclaimWithinCohort: {RECLAIM_BORROWED[old]}; give reclaimWithinCohort only"))
    else:
        out["reclaimWithinCohort"] = RECLAIM_BORROWED[old]


def _borrow_within_cohort(raw: Any, errors: list) -> dict:
    """``{policy: Never | LowerPriority, maxPriorityThreshold}`` (Kueue's): whether a claim that must borrow may
    preempt lower-priority claims of other queues that borrow, up to that priority."""
    path = "spec.preemption.borrowWithinCohort"
    if not isinstance(raw, dict):
        errors.append(f.invalid(path, raw, "must be an object"))
        return {"policy": "Never"}
    for key in raw:
        if key not in ("policy", "maxPriorityThreshold"):
            errors.append(f.unsupported(f"{path}.{key}", key, ("policy", "maxPriorityThreshold")))
    out: dict = {"policy": "Never"}
    policy = raw.get("policy", "Never")
    if policy not in BORROW_WITHIN_COHORT:
        errors.append(f.unsupported(f"{path}.policy", policy, BORROW_WITHIN_COHORT))
    else:
        out["policy"] = policy
    threshold = raw.get("maxPriorityThreshold")
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, int):
            errors.append(f.invalid(f"{path}.maxPriorityThreshold", threshold, "must be an integer"))
        elif out["policy"] == "Never":
            errors.append(f.invalid(f"{path}.maxPriorityThreshold", threshold, "applies only with policy "
                                                                                "LowerPriority"))
        else:
            out["maxPriorityThreshold"] = threshold
    return out


def _webhook(raw: Any, errors: list) -> dict:
    """``{url, secret}``: the URL's target must be on the allow-list exactly (``draservice.webhooks``); the
    secret, if given, a Standard Webhooks ``whsec_`` one (the server generates one when it is left out)."""
    path = "spec.preemption.webhook"
    if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
        errors.append(f.invalid(path, raw, "must be {url, secret}"))
        return {}
    for key in raw:
        if key not in ("url", "secret", "secretSet"):  # secretSet: what a GET shows, ignored on the way back
            errors.append(f.unsupported(f"{path}.{key}", key, ("url", "secret")))
    url = raw["url"]
    try:
        webhooks.check_url(url)
    except webhooks.TargetRefused as exc:
        words = str(exc)
        allow_list = "allow-list" in words
        errors.append(f.forbidden(f"{path}.url", words) if allow_list else f.invalid(f"{path}.url", url, words))
    out = {"url": url}
    secret = raw.get("secret")
    if secret is not None:
        key = webhooks.secret_key(secret) if isinstance(secret, str) else None
        if key is None or not 16 <= len(key) <= 64:
            errors.append(f.invalid(f"{path}.secret", "<hidden>", "must be whsec_ followed by the base64 of 16 to 64 "
                                                                  "random bytes; leave it out to have one generated"))
        else:
            out["secret"] = secret
    return out
