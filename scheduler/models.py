"""The scheduler's own rows: the plan (``scheduler.services.plan``)."""
from __future__ import annotations

import uuid

from django.db import models

from claims.models import ResourceClaim


class PlannedStart(models.Model):
    """One of a queue's first ``planDepth`` pending claims, and when and where the plan starts it: on
    ``devices`` ([cluster, driver, pool, device] lists) of ``cluster``/``node`` at ``start_at`` (null: no start
    among the running claims' ends -- something it needs is held by a claim with no walltime), until
    ``end_at`` (null: it has no walltime). Every pass rewrites the whole set (``computed_at``)."""

    # No database constraint and no cascade: a claim's delete must not wait on the plan's rows, which a pass
    # rewrites as a whole (a delete cascading into them while a pass held them deadlocked with the rounds).
    # A deleted claim's row is left for the next pass; readers join the claims, and find none for it.
    claim = models.OneToOneField(ResourceClaim, on_delete=models.DO_NOTHING, db_constraint=False, primary_key=True,
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


class ReplayState(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Replay(models.Model):
    """A recorded window replayed under a configuration (``scheduler.services.replays``): asked for by an admin,
    run by a replay worker (never an allocation worker), its comparison kept in ``results``."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    state = models.CharField(max_length=16, choices=ReplayState.choices, default=ReplayState.PENDING)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    configuration = models.JSONField(default=dict, blank=True)  # the overrides, as given (normalized)
    budget_seconds = models.FloatField()
    author = models.CharField(max_length=160)
    message = models.TextField(blank=True, default="")
    results = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["id"], condition=models.Q(state="Pending"), name="scheduler_replay_pending")]
