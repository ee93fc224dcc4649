"""The in-process runner of the embedded default (no broker): writers wake it by task name, it runs the beat
schedule collected from the apps, and it stops and joins cleanly."""
from __future__ import annotations

import time

import pytest

from claims.models import Phase, ResourceClaim
from draservice import dispatch
from draservice.runner import PeriodicRunner
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_write_wakes_the_runner_which_allocates_outside_the_request(admin_client, settings):
    settings.CELERY_BROKER_URL = ""
    load_fleet({"c1": [("h100", 1)]})
    runner = PeriodicRunner(schedule={})
    ran = []
    original = runner._run_task
    runner._run_task = lambda name: (ran.append(name), original(name))  # type: ignore[method-assign]
    runner.start()
    try:
        resp = admin_client.post("/api/v1/namespaces/ci/resourceclaims", gpu_claim("woken"), format="json")
        assert resp.status_code == 201, resp.content
        deadline = time.monotonic() + 20
        while ResourceClaim.objects.get(name="woken").phase != Phase.ALLOCATED:
            assert time.monotonic() < deadline, "the runner did not allocate"
            time.sleep(0.05)
        assert "claims.tasks.allocate_pending" in ran
    finally:
        runner.stop()
        runner.join(10)
    assert not runner.is_alive()  # stop() + join(): no shadowed Thread internals
    assert runner not in dispatch._runners


def test_the_runner_runs_the_collected_schedule_on_time(settings):
    settings.CELERY_BROKER_URL = ""
    runner = PeriodicRunner()  # the whole collected beat schedule
    assert {e["task"] for e in runner.schedule.values()} >= {"claims.tasks.expire_leases",
                                                            "inventory.tasks.sweep_stale_clusters"}
    runner = PeriodicRunner(schedule={"sweep": {"task": "inventory.tasks.sweep_stale_clusters", "schedule": 0.05}})
    ran = []
    runner._run_task = lambda name: ran.append(name)  # type: ignore[method-assign]
    runner.start()
    time.sleep(0.5)
    runner.stop()
    runner.join(10)
    assert not runner.is_alive() and ran.count("inventory.tasks.sweep_stale_clusters") >= 3


def test_make_runs_notify_runner_delivers_webhooks_in_a_thread_of_its_own(settings):
    """Without a broker (make run), a new delivery wakes the notify runner, not the allocation runner: a slow
    receiver holds the notify thread only."""
    from draservice import deliveries, webhooks
    from draservice.models import DeliveryStatus, WebhookDelivery
    from draservice.runner import NOTIFY_ON_DEMAND, split_schedule
    from tests.queues.receivers import Receiver

    settings.CELERY_BROKER_URL = ""
    main, notify = split_schedule(dict(settings.CELERY_BEAT_SCHEDULE))
    assert "draservice-deliver-webhooks" in notify and "draservice-deliver-webhooks" not in main and main
    receiver = Receiver()
    settings.WEBHOOK_ALLOWED_TARGETS = [receiver.target]
    allocation, notifier = PeriodicRunner(schedule={}), PeriodicRunner({}, NOTIFY_ON_DEMAND, name="notify-runner")
    ran: dict[str, list] = {"allocation": [], "notify": []}
    for key, runner in (("allocation", allocation), ("notify", notifier)):
        original = runner._run_task
        runner._run_task = lambda name, k=key, o=original: (ran[k].append(name), o(name))  # type: ignore
        runner.start()
    try:
        d = deliveries.create("preemption.pending", "queue/q", receiver.url(), webhooks.generate_secret(), {"a": 1})
        deliveries.kick([d.id])
        deadline = time.monotonic() + 10
        while WebhookDelivery.objects.get(id=d.id).status != DeliveryStatus.DELIVERED:
            assert time.monotonic() < deadline, "the notify runner did not deliver"
            time.sleep(0.05)
        assert ran == {"allocation": [], "notify": ["draservice.tasks.deliver_due"]} and receiver.connections == 1
    finally:
        for runner in (allocation, notifier):
            runner.stop()
            runner.join(10)
        receiver.close()
