"""A slow webhook receiver costs nobody else (issue 28, Why item 2), with real Celery workers: an allocation
worker (``--pool solo``: one task at a time, as the issue's two workers were taken) and a notify worker on the
run's own notify queue. The preemption notice goes to a receiver that trickles one byte every 2 s: the attempt
is abandoned at the 10 s deadline (``timeout``), a canary claim allocates meanwhile in < 2 s, and the retry goes
to the URL the notice was created with although the queue's webhook was changed in between."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from claims.models import Phase, ResourceClaim
from draservice import webhooks
from draservice.models import DeliveryStatus, WebhookDelivery
from tests.claims.fleet import gpu_claim, load_fleet
from tests.claims.workers import ROOT, WorkerPool
from tests.queues.conftest import queue_body
from tests.queues.receivers import Receiver
from tests.queues.test_admission import make, ns, submit
from usage.models import DecayedUsage, DecayedUsageDelta

pytestmark = [pytest.mark.django_db(transaction=True)]

WORKERS = 1  # allocation workers (read by the worker_pool fixture)
SECRET = webhooks.generate_secret()


class NotifyWorker(WorkerPool):
    """One notify worker as deployed (``-Q <notify queue> --pool threads``), with the receivers allowed."""

    def __init__(self, broker_url: str, queue: str, allowed: list[str]):
        super().__init__(broker_url, queue=queue)
        self.allowed = allowed

    def start(self, n: int = 1) -> None:
        log = Path(f"/tmp/notify-worker-{self.queue}.log")
        env = {**self.env(0), "WEBHOOK_ALLOWED_TARGETS": ",".join(self.allowed),
               "CLAIMS_TEST_QUEUE": self.queue.removesuffix("-notify")}
        cmd = [sys.executable, "-m", "celery", "-A", "tests.claims.celery_test_app", "worker", "--pool", "threads",
               "--concurrency", "2", "-Q", self.queue, "-n", f"notify-{self.queue}@%h", "--without-gossip",
               "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]
        self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT))
        self.logs.append(log)
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text():
            if self.procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"notify worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)


@pytest.fixture
def receivers():
    trickle, later = Receiver(answers=[("trickle", 2.0), ("status", 204, {})]), Receiver()
    yield trickle, later
    trickle.close()
    later.close()


@pytest.fixture
def notify_worker(live_broker, receivers, settings):
    settings.NOTIFY_QUEUE = f"{live_broker.queue}-notify"
    settings.WEBHOOK_ALLOWED_TARGETS = [r.target for r in receivers]
    worker = NotifyWorker(live_broker.broker_url, settings.NOTIFY_QUEUE, settings.WEBHOOK_ALLOWED_TARGETS)
    worker.start()
    yield worker
    worker.stop()  # before live_broker's teardown flushes the tables under it


def wait_for(what: str, check, timeout: float, pool=None):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{pool.log_tail() if pool else ''}"
        time.sleep(0.05)
    return found


def test_a_trickling_receiver_is_abandoned_at_the_deadline_and_allocation_goes_on(
        admin_client, live_broker, notify_worker, receivers):
    trickle, later = receivers
    load_fleet({"c1": [("h100", 2), ("mi300x", 1)]})
    hook = {"url": trickle.url(), "secret": SECRET}
    patch = {"spec": {"preemption": {"graceSeconds": 300, "minRuntimeSeconds": 0, "webhook": hook}}}
    assert admin_client.patch("/api/v1/queues/default", patch, format="json").status_code == 200
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8))
    for i in range(16):  # the default queue borrows all 16 H100s
        submit(admin_client, "ci", f"ci{i}")
    allocated = ResourceClaim.objects.filter(phase=Phase.ALLOCATED)
    wait_for("16 borrowers allocated", lambda: allocated.count() == 16, 60, live_broker)
    submit(admin_client, "a", "mine", 1)
    wait_for("team-a's claim found no room", lambda: ResourceClaim.objects.filter(
        name="mine", reason="Unsatisfiable").exists(), 30, live_broker)

    from draservice.celery import app

    app.send_task("queues.tasks.preempt")  # on the allocation worker, as beat would
    wait_for("the notice reached the receiver", lambda: trickle.requests, 30, notify_worker)
    opened = trickle.requests[0].opened
    # The queue's webhook moves on: the notice's retry must still go where it was created to go.
    patch = {"spec": {"preemption": {"webhook": {"url": later.url()}}}}
    assert admin_client.patch("/api/v1/queues/default", patch, format="json").status_code == 200

    # Meanwhile a canary claim of another class allocates at once: the allocation worker is not held.
    started = time.monotonic()
    resp = admin_client.post(f"{ns('canary')}/resourceclaims", gpu_claim("canary", device_class="gpu.amd.com"),
                             format="json")
    assert resp.status_code == 201, resp.content
    wait_for("the canary allocated", lambda: ResourceClaim.objects.filter(
        name="canary", phase=Phase.ALLOCATED).exists(), 2.0, live_broker)
    canary_seconds = time.monotonic() - started
    assert trickle.requests[0].closed is None  # still trickling while the canary went through

    first = wait_for("the trickle abandoned", lambda: trickle.requests[0].closed, 15, notify_worker)
    assert 9.9 <= first - opened <= 11.0, first - opened  # the whole attempt's deadline, not per read
    # The worker records the attempt after it has closed the connection the receiver saw close.
    delivery = wait_for("the failed attempt recorded", lambda: WebhookDelivery.objects.filter(
        attempts__gte=1).first(), 5, notify_worker)
    assert delivery.last_error.startswith("attempt 1 failed: timeout"), delivery.last_error

    wait_for("the retry delivered", lambda: WebhookDelivery.objects.filter(
        status=DeliveryStatus.DELIVERED).exists(), 10, notify_worker)
    assert (trickle.connections, later.connections) == (2, 0)  # the captured URL, not the one set later
    a, b = trickle.requests
    assert a.head["webhook-id"] == b.head["webhook-id"] == delivery.message_id
    notice = Webhook(SECRET).verify(b.body, b.head)
    assert notice["kind"] == "PreemptionNotice" and notice["preemptor"] == {"namespace": "a", "name": "mine"}
    listed = admin_client.get("/api/v1/queues/default/deliveries").json()["items"]
    assert [(i["status"], i["attempts"], i["url"]) for i in listed] == [("Delivered", 2, trickle.url())]
    assert listed[0]["lastError"].startswith("attempt 1 failed: timeout")
    print(f"canary allocated in {canary_seconds:.2f} s; trickle abandoned after {first - opened:.2f} s "
          f"(load {os.getloadavg()[0]:.2f})")


def test_the_notify_worker_folds_the_releases_decayed_usage(admin_client, live_broker, notify_worker, h100_fleet,
                                                             settings):
    """The fold beat sends (``usage.tasks.fold_decay``, notify queue) runs on a real notify worker: the releases'
    delta rows of a fair-sharing queue go into its total, and the figure the queue reports does not change."""
    make(admin_client, queue_body("team-b", namespaces=["b"], gpus=0, fairSharing={"halfLifeSeconds": 3600}))
    for i in range(3):
        submit(admin_client, "b", f"job{i}", 2)
    allocated = ResourceClaim.objects.filter(phase=Phase.ALLOCATED)
    wait_for("3 claims allocated", lambda: allocated.count() == 3, 30, live_broker)
    for i in range(3):
        assert admin_client.post(f"{ns('b')}/resourceclaims/job{i}/release").status_code == 200
    assert DecayedUsageDelta.objects.filter(queue="team-b").count() == 3
    reported = admin_client.get("/api/v1/queues/team-b").json()["status"]["fairSharing"]["decayedUsage"]
    assert reported > 0

    from draservice.celery import app

    app.send_task("usage.tasks.fold_decay", queue=settings.NOTIFY_QUEUE)  # as beat does every FOLD_SECONDS
    wait_for("the deltas folded", lambda: not DecayedUsageDelta.objects.exists(), 15, notify_worker)
    assert DecayedUsage.objects.get(queue="team-b").value > 0
    after = admin_client.get("/api/v1/queues/team-b").json()["status"]["fairSharing"]["decayedUsage"]
    assert after == pytest.approx(reported, rel=5e-3)  # a few seconds of a one-hour half-life apart
