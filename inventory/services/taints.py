"""The taints a device carries as the allocator sees them: its slice's own plus those DeviceTaintRules add.

A rule applies to the devices of its own cluster (or of every cluster when it is fleet-wide) that its
``deviceSelector`` matches, with upstream's semantics (``dra.k8s.slices.taint_rule_matches``): every given
criterion (driver, pool, device) must match, an empty selector matches every device, no selector none.
The engine applies the same rules to the same devices (``dra.engine.model``); a taint from a rule carries
``source`` naming the rule, so a reader can tell it from the driver's own taints.
"""
from __future__ import annotations

from django.db.models import Exists, OuterRef, Q

from dra.k8s.slices import taint_rule_matches
from inventory.models import DeviceTaintRule

TAINT_KEYS = ("key", "value", "effect", "timeAdded")


def _taint_of(rule: DeviceTaintRule) -> dict:
    taint = (rule.object.get("spec") or {}).get("taint") or {}
    out = {k: taint[k] for k in TAINT_KEYS if taint.get(k) is not None}
    out["source"] = {"kind": "DeviceTaintRule", "name": rule.name, "scope": "cluster" if rule.cluster_id else "fleet"}
    return out


def rule_taints(devices: list) -> dict[int, list[dict]]:
    """``{device.pk: [taint, ...]}`` added by DeviceTaintRules, for a page of ``Device`` rows (one query)."""
    if not devices:
        return {}
    cluster_ids = {d.cluster_id for d in devices}
    rules = list(DeviceTaintRule.objects.filter(Q(cluster__isnull=True) | Q(cluster_id__in=cluster_ids))
                 .order_by("name", "cluster_id"))
    out: dict[int, list[dict]] = {}
    for device in devices:
        taints = [_taint_of(r) for r in rules if r.cluster_id in (None, device.cluster_id)
                  and taint_rule_matches(r.object.get("spec") or {}, device.driver, device.pool_name, device.name)]
        if taints:
            out[device.pk] = taints
    return out


def covered_by_a_rule() -> Q:
    """A filter on ``Device``: some DeviceTaintRule taints it (the SQL twin of ``rule_taints``)."""
    rules = DeviceTaintRule.objects.filter(
        Q(cluster__isnull=True) | Q(cluster_id=OuterRef("cluster_id")),
        Q(driver="") | Q(driver=OuterRef("driver")),
        Q(pool_name="") | Q(pool_name=OuterRef("pool_name")),
        Q(device_name="") | Q(device_name=OuterRef("name")),
        object__spec__has_key="deviceSelector",
    )
    return Q(Exists(rules))


def tainted_condition() -> Q:
    return ~Q(taints=[]) | covered_by_a_rule()
