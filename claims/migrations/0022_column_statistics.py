"""Statistics targets for the claims tables' columns (PostgreSQL only): see draservice.upkeep_sql.set_statistics.

The claims table is analyzed every few seconds under load; with its JSON documents at the default target (100)
each ANALYZE took a second of a core, and the allocation rounds beside it slowed. Documents and free text get
none; the claims table's other columns a sample of 6,000 rows (target 20): its filters are few-valued (phase,
cluster, reason) or answered by unique and partial indexes. Every column of the claims table gets an explicit
target (a test checks that none is left at the default), so a new column has to choose one.
"""
from django.db import migrations

from draservice.upkeep_sql import set_statistics

NONE, SMALL = 0, 20
CLAIM_DOCUMENTS = ("labels", "annotations", "spec", "allowed_cluster_selector", "message", "conditions",
                   "allocation", "diagnostics", "preemption")
CLAIM_FILTERS = ("id", "name", "uid", "resource_version", "source_api_version", "preferred_cluster", "phase",
                 "reason", "cluster", "node", "attempts", "attempted_version", "last_attempt_at", "lease_seconds",
                 "lease_expires_at", "lease_renewed_at", "created_at", "updated_at", "allocated_at", "released_at",
                 "namespace_id", "owner_id", "template_id", "device_removed_at", "taken_until", "taken_by",
                 "change_seq", "pending_deadline")


class Migration(migrations.Migration):

    dependencies = [
        ("claims", "0021_claims_fillfactor"),
    ]

    operations = [
        set_statistics("claims_resourceclaim", {**{c: NONE for c in CLAIM_DOCUMENTS},
                                                **{c: SMALL for c in CLAIM_FILTERS}}),
        set_statistics("claims_claimhistory", {"labels": NONE, "spec": NONE}),
        set_statistics("claims_claimevent", {"message": NONE, "data": NONE}),
    ]
