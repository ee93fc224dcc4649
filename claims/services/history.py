"""Claims' history for replay: how each claim arrived (``ClaimHistory``), kept ``HISTORY_DAYS`` after it is gone.

Written by the claims' one writer when a claim is created: on PostgreSQL inside the create's one statement
(``insert_cte``: a data-modifying WITH query over the claims just inserted, so a claim and its history row
exist together or not at all, at no extra round trip), elsewhere (SQLite, a consumer's generated claims) by
``record`` in the create's transaction. Nothing updates a row; ``prune`` (a beat task) deletes the rows older
than ``HISTORY_DAYS``. Allocation and release times are not repeated here: the usage ledger keeps them.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from claims.models import ClaimHistory

PRUNE_BATCH = 10_000


def insert_cte(claims: str, namespaces: str) -> str:
    """``h AS (INSERT ...)``: the history rows of the claims a CTE named ``claims`` returned (uid, name, labels,
    spec, lease_seconds, created_at), their namespace's name from the CTE ``namespaces``."""
    table = connection.ops.quote_name(ClaimHistory._meta.db_table)
    return (f"h AS (INSERT INTO {table} (claim_uid, namespace, claim_name, labels, spec, lease_seconds, created_at) "
            f"SELECT {claims}.uid, {namespaces}.name, {claims}.name, {claims}.labels, {claims}.spec, "
            f"{claims}.lease_seconds, {claims}.created_at FROM {claims} CROSS JOIN {namespaces})")


def record(claims: list) -> None:
    """History rows for claims just inserted (call inside the create's transaction)."""
    now = timezone.now()
    ClaimHistory.objects.bulk_create([
        ClaimHistory(claim_uid=c.uid, namespace=c.namespace.name, claim_name=c.name, labels=c.labels or {},
                     spec=c.spec or {}, lease_seconds=c.lease_seconds, created_at=c.created_at or now)
        for c in claims])


def prune(now=None, batch: int = PRUNE_BATCH) -> int:
    """Delete history older than ``HISTORY_DAYS``, a batch at a time (a short transaction each)."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.HISTORY_DAYS)
    deleted = 0
    while True:
        ids = list(ClaimHistory.objects.filter(created_at__lt=cutoff).order_by("id").values_list("id", flat=True)
                   [:batch])
        if not ids:
            return deleted
        deleted += ClaimHistory.objects.filter(id__in=ids).delete()[0]
