"""The scheduler's own rows: the plan (``scheduler.services.plan``)."""
from __future__ import annotations

from django.db import models

from claims.models import ResourceClaim


class PlannedStart(models.Model):
    """One of a queue's first ``planDepth`` pending claims, and when and where the plan starts it: on
    ``devices`` ([cluster, driver, pool, device] lists) of ``cluster``/``node`` at ``start_at`` (null: no start
    among the running claims' ends -- something it needs is held by a claim with no walltime), until
    ``end_at`` (null: it has no walltime). Every pass rewrites the whole set (``computed_at``)."""

    claim = models.OneToOneField(ResourceClaim, on_delete=models.CASCADE, primary_key=True,
                                 related_name="planned_start")
    queue = models.CharField(max_length=63)
    position = models.IntegerField()  # 1-based, among its queue's pending claims
    cluster = models.CharField(max_length=63, blank=True, default="")
    node = models.CharField(max_length=253, blank=True, default="")
    devices = models.JSONField(default=list, blank=True)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    computed_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["queue", "position"], name="scheduler_plan_queue_pos")]
