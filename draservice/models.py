"""The change log: one row per change of a watched object, keyed by a global, monotonic sequence.

Written by database triggers (installed by each watched app's migrations; see ``draservice.changes``), so no
write path can forget it: the claims round, gangs, queues and the API all change claim rows, and every
such change lands here in the same transaction. Read by the Kubernetes front door's ``watch`` and list
``resourceVersion``; kept for ``CHANGES_RETENTION`` (older watches get 410 Gone).
"""
from django.db import models


class Change(models.Model):
    seq = models.BigAutoField(primary_key=True)  # the resourceVersion of this change
    txid = models.BigIntegerField(default=0)  # the writer's PostgreSQL transaction id (gap detection)
    resource = models.CharField(max_length=63)  # e.g. "resourceclaims"
    namespace = models.CharField(max_length=63, blank=True, default="")
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=36)
    row_id = models.BigIntegerField()
    type = models.CharField(max_length=8)  # ADDED, MODIFIED, DELETED
    tombstone = models.JSONField(null=True, blank=True)  # the row as it was deleted (DELETED only)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["at"], name="draservice_change_at")]


class ChangeLogState(models.Model):
    """One row: how far the log is known settled, and how far it has been compacted."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    settled = models.BigIntegerField(default=0)  # every seq <= settled is committed or will never be
    compacted_through = models.BigIntegerField(default=0)  # rows with seq <= this may be gone
    # Entries of ``changes.ROW_RESOURCES`` (kept a shorter while) with seq <= this may be gone. Always <= settled.
    rows_compacted_through = models.BigIntegerField(default=0)
    pending_seq = models.BigIntegerField(default=0)  # the sequence's value when the horizon was taken
    pending_horizon = models.BigIntegerField(default=0)  # the next transaction id at that moment
