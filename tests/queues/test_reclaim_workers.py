"""Reclaim with real Celery workers on PostgreSQL (long tier): the preemption pass sent as the beat sends it,
the rounds run by the workers. Two queues within their nominal compete for a fleet a borrower fills: exactly
as many victims as GPUs asked for, and both preemptors run."""
from __future__ import annotations

import time

import pytest
from django.db.models import Count

from claims.models import DeviceAllocation, Phase, ResourceClaim
from draservice.celery import app
from queues.models import Preemption
from tests.claims.fleet import load_fleet
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.long]

WORKERS = 2  # read by the worker_pool fixture


def wait_for(check, timeout: float, step: float = 0.3, kick=None) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "timed out"
        if kick:
            kick()
        time.sleep(step)
    return time.monotonic() - started


def test_two_queues_reclaim_exactly_what_they_need_with_workers(admin_client, live_broker):
    load_fleet({"c1": [("h100", 2)]})
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {"graceSeconds": 1}}},
                              format="json").status_code == 200
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8),
         queue_body("team-b", namespaces=["b"], gpus=8))
    for i in range(16):
        submit(admin_client, "ci", f"ci{i}")
    wait_for(lambda: DeviceAllocation.objects.count() == 16, 60)
    submit(admin_client, "a", "want-a", 4)
    submit(admin_client, "b", "want-b", 2)
    wait_for(lambda: set(ResourceClaim.objects.filter(namespace__name__in=["a", "b"])
                         .values_list("reason", flat=True)) == {"Unsatisfiable"}, 30)
    took = wait_for(lambda: ResourceClaim.objects.filter(namespace__name__in=["a", "b"], phase=Phase.ALLOCATED)
                    .count() == 2, 30, step=0.5, kick=lambda: app.send_task("queues.tasks.preempt"))
    assert took <= 1 + 5, took  # grace 1 s, a pass every half second, rounds by the workers
    time.sleep(2)  # a few more passes: nothing more is preempted
    for _ in range(3):
        app.send_task("queues.tasks.preempt")
    time.sleep(1.5)
    assert Preemption.objects.count() == 6
    assert dict(Preemption.objects.values_list("preemptor__name").annotate(n=Count("id"))) == {
        "want-a": 4, "want-b": 2}
    assert DeviceAllocation.objects.count() == 16
    assert ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.PENDING).count() == 6
