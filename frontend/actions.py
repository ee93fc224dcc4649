"""The dashboard's write actions, each a thin call into the owning app's service layer (which takes the
locks, records events and tells the allocator). Views check permissions before calling these."""
from __future__ import annotations

import re
import secrets

from django.db.models import Q

from draservice.errors import ServiceError
from inventory.models import Cluster, Device, DeviceTaintRule

TAINT_EFFECTS = ("NoSchedule", "NoExecute")
TAINT_KEY = "draservice.io/dashboard"


class ActionError(Exception):
    """Something a person can fix or needs to know; shown as a message on the page."""


def _rule_name(device: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", f"dashboard-{device}".lower()).strip("-")[:50]
    return f"{base}-{secrets.token_hex(3)}"


def taint_scope(driver: str, pool: str, device: str) -> int:
    """How many devices a fleet-wide rule for (driver, pool, device) would select, across all clusters."""
    return Device.objects.filter(driver=driver, pool_name=pool, name=device).values("cluster_id").distinct().count()


def taint_device(cluster: Cluster, driver: str, pool: str, device: str, *, effect: str, reason: str,
                 user) -> DeviceTaintRule:
    """Keep new claims off one device with a fleet-wide DeviceTaintRule (v1alpha3 shape).

    DeviceTaintRule selects by driver/pool/device only (no cluster), so the rule reaches the same
    (driver, pool, device) in every cluster; ``taint_scope`` lets the page say so before anyone clicks.
    """
    from inventory.services.fleet import create_fleet_object

    if effect not in TAINT_EFFECTS:
        raise ActionError(f"effect must be one of {', '.join(TAINT_EFFECTS)}")
    if not Device.objects.filter(cluster=cluster, driver=driver, pool_name=pool, name=device).exists():
        raise ActionError("no such device")
    body = {
        "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule",
        "metadata": {"name": _rule_name(device),
                     "annotations": {"draservice.io/created-by": user.get_username(),
                                     "draservice.io/reason": reason[:500]}},
        "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                 "taint": {"key": TAINT_KEY, "value": (user.get_username() or "operator")[:63], "effect": effect}},
    }
    try:
        return create_fleet_object(DeviceTaintRule, body)
    except ServiceError as exc:
        raise ActionError(f"the taint rule was refused: {exc}") from exc


def device_taint_rules(cluster: Cluster, driver: str, pool: str, device: str) -> list[DeviceTaintRule]:
    return list(DeviceTaintRule.objects.filter(Q(cluster=cluster) | Q(cluster__isnull=True))
                .filter(Q(driver="") | Q(driver=driver), Q(pool_name="") | Q(pool_name=pool),
                        Q(device_name="") | Q(device_name=device)))


def release_claim(namespace: str, name: str, *, user) -> None:
    """Free a claim's devices now, through the claims service (events, locks, allocator wake-up)."""
    from claims.models import ResourceClaim
    from claims.services.claims import release_claim as release

    claim = ResourceClaim.objects.filter(namespace__name=namespace, name=name).first()
    if claim is None:
        raise ActionError("no such claim")
    if claim.phase not in ("Pending", "Allocated"):
        raise ActionError(f"the claim is {claim.phase.lower()}: there is nothing to release")
    release(claim.id, reason="ReleasedByOperator", message=f"released from the dashboard by {user.get_username()}")
