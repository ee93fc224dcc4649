"""Object-count and rate caps per namespace: what one tenant may pile up, so that it cannot cost the others.

Two count caps, refused as a Kubernetes ResourceQuota refuses (``QuotaExceeded``: 403 ``Forbidden`` at the doors,
"exceeded quota: ..."):

* ``pending-claims``: the namespace's claims waiting for devices (default ``NAMESPACE_MAX_PENDING_CLAIMS``,
  5,000). Every round reads the pending claims; a namespace that queues 100,000 slows every tenant's rounds.
* ``resourcepoolstatusrequests``: ResourcePoolStatusRequests its tokens created and the service still keeps
  (kept 24 h; default ``NAMESPACE_MAX_POOL_STATUS_REQUESTS``, 100). Each one is answered with aggregate
  queries over the fleet at creation; they are also rate-capped, ``POOL_STATUS_REQUESTS_PER_MINUTE`` per
  owner (``Throttled``: 429 with ``Retry-After``).

An admin changes a namespace's caps at run time with ``PUT``/``PATCH /api/v1/namespaces/{ns}/objectquota``
(``{"spec": {"hard": {"pending-claims": 20000}}}``; null or ``DELETE`` goes back to the defaults); other
processes see the change within ``CACHE_SECONDS``. A ResourcePoolStatusRequest is cluster-scoped: it counts
against the namespace of the namespace token that created it (the first of its namespaces), a cluster token's
against the default caps, an admin's against none.

Cost per create: one COUNT over a partial index, bounded by the cap (``LIMIT``); on PostgreSQL inside the
create's INSERT statement (no round trip of its own). The check runs at the insert without a lock, so
concurrent creates can pass the cap by at most their number (as a ResourceQuota can be passed by racing
admissions before its status catches up): a cap, not an accounting.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from claims.models import ObjectQuota, Phase, ResourceClaim
from draservice.errors import Invalid, QuotaExceeded, Throttled

PENDING_CLAIMS = "pending-claims"
POOL_STATUS_REQUESTS = "resourcepoolstatusrequests"
FIELDS = {PENDING_CLAIMS: "pending_claims", POOL_STATUS_REQUESTS: "pool_status_requests"}
MAX_CAP = 10_000_000
CACHE_SECONDS = 5.0
RATE_WINDOW = timedelta(seconds=60)

_cache: dict[str, tuple[float, dict[str, int]]] = {}
# The use of a cap whose objects another app keeps (ResourcePoolStatusRequests: the /k8s door's), by cap name:
# that app registers its count at ready(), so the ObjectQuota shows it while this module imports no door.
_use_counts: dict[str, Callable[[str], int]] = {}


def register_use_count(cap: str, count: Callable[[str], int]) -> None:
    """``count(namespace)``: how many of the cap's objects count against the namespace."""
    _use_counts[cap] = count


def defaults() -> dict[str, int]:
    return {PENDING_CLAIMS: settings.NAMESPACE_MAX_PENDING_CLAIMS,
            POOL_STATUS_REQUESTS: settings.NAMESPACE_MAX_POOL_STATUS_REQUESTS}


def hard(namespace: str) -> dict[str, int]:
    """The namespace's effective caps (its admin-set ones over the defaults), cached ``CACHE_SECONDS``."""
    hit = _cache.get(namespace)
    if hit is not None and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    caps = defaults()
    row = ObjectQuota.objects.filter(namespace=namespace).first()
    if row is not None:
        caps.update({name: getattr(row, column) for name, column in FIELDS.items()
                     if getattr(row, column) is not None})
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[namespace] = (time.monotonic(), caps)
    return caps


def _exceeded(kind: str, quota: str, limit: int, used: int, adding: int) -> QuotaExceeded:
    return QuotaExceeded(f"{kind} is forbidden: exceeded quota: {quota}, limit {limit} (used {used}, "
                         f"requested {adding})")


def check_pending_claims(namespace: str, adding: int) -> None:
    """Refuse ``adding`` new claims that would take the namespace's pending claims over its cap."""
    limit = pending_claims_limit(namespace)
    used = pending_claims_used(namespace, limit)
    if used + adding > limit:
        refuse_pending_claims(limit, used, adding)


def pending_claims_used(namespace: str, limit: int) -> int:
    """The namespace's pending claims, counted no further than past ``limit``."""
    pending = ResourceClaim.objects.filter(namespace__name=namespace, phase=Phase.PENDING)
    return pending.values("id")[:limit + 1].count()


def pending_claims_limit(namespace: str) -> int:
    """The namespace's ``pending-claims`` cap. The claims' writer on PostgreSQL counts the pending claims in its
    INSERT statement itself (``claims.services.claims``: no statement of its own per create) and refuses with
    ``refuse_pending_claims``."""
    return hard(namespace)[PENDING_CLAIMS]


def refuse_pending_claims(limit: int, used: int, adding: int) -> None:
    raise _exceeded("resourceclaims", PENDING_CLAIMS, limit, used, adding)


def pool_status_owner(access) -> str:
    """Whom a ResourcePoolStatusRequest counts against (``draservice.permissions.Access``)."""
    if access.is_admin:
        return ""
    if access.namespaces:
        return f"ns:{min(access.namespaces)}"
    if access.cluster_name:
        return f"cluster:{access.cluster_name}"
    return f"{access.kind}:{access.token.pk if access.token is not None else ''}"


def check_pool_status_requests(owner: str, mine: QuerySet) -> None:
    """The count cap (``QuotaExceeded``) and the rate cap (``Throttled``) of ResourcePoolStatusRequests; ``mine``: the
    requests kept for ``owner`` (rows with ``created_at``), handed over by the door that keeps them."""
    if not owner:
        return
    since = timezone.now() - RATE_WINDOW
    rate = settings.POOL_STATUS_REQUESTS_PER_MINUTE
    recent = list(mine.filter(created_at__gte=since).order_by("created_at").values_list("created_at", flat=True)
                  [:rate])
    if len(recent) >= rate:
        wait = max(1, math.ceil((recent[0] - since).total_seconds()))
        raise Throttled(f"resourcepoolstatusrequests: at most {rate} a minute; retry in {wait} s", wait=wait)
    limit = (hard(owner[3:]) if owner.startswith("ns:") else defaults())[POOL_STATUS_REQUESTS]
    used = mine.values("id")[:limit + 1].count()
    if used + 1 > limit:
        raise _exceeded("resourcepoolstatusrequests", POOL_STATUS_REQUESTS, limit, used, 1)


# ------------------------------------------------------------------------------------------ the admin's view

def render(namespace: str) -> dict:
    """The namespace's caps and use, shaped like a v1 ResourceQuota."""
    _cache.pop(namespace, None)
    caps = hard(namespace)
    row = ObjectQuota.objects.filter(namespace=namespace).first()
    set_here = {name: getattr(row, column) for name, column in FIELDS.items()
                if row is not None and getattr(row, column) is not None}
    used = {PENDING_CLAIMS: ResourceClaim.objects.filter(namespace__name=namespace, phase=Phase.PENDING).count(),
            POOL_STATUS_REQUESTS: _use_counts[POOL_STATUS_REQUESTS](namespace)
            if POOL_STATUS_REQUESTS in _use_counts else 0}
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "ObjectQuota",
            "metadata": {"name": "objectquota", "namespace": namespace},
            "spec": {"hard": set_here}, "status": {"hard": caps, "used": used, "defaults": defaults()}}


def update(namespace: str, body, *, replace: bool) -> dict:
    """Set caps from ``{"spec": {"hard": {name: count or null}}}``; ``replace`` (PUT) resets those not named."""
    spec = body.get("spec") if isinstance(body, dict) else None
    given = spec.get("hard") if isinstance(spec, dict) else None
    if not isinstance(given, dict):
        raise Invalid([("spec.hard", "Required value: a map of cap name to count")])
    errors = []
    for name, value in given.items():
        path = f"spec.hard[{name}]"
        if name not in FIELDS:
            errors.append((path, f'Unsupported value: "{name}": supported values: "{PENDING_CLAIMS}", '
                                 f'"{POOL_STATUS_REQUESTS}"'))
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                    or not 0 <= value <= MAX_CAP):
            errors.append((path, f"Invalid value: {value!r}: must be an integer between 0 and {MAX_CAP}, or "
                                 "null for the default"))
    if errors:
        raise Invalid(errors)
    with transaction.atomic():
        row, _ = ObjectQuota.objects.select_for_update().get_or_create(namespace=namespace)
        for name, column in FIELDS.items():
            if name in given or replace:
                setattr(row, column, given.get(name))
        row.save()
    _cache.pop(namespace, None)
    return render(namespace)


def reset(namespace: str) -> None:
    ObjectQuota.objects.filter(namespace=namespace).delete()
    _cache.pop(namespace, None)
