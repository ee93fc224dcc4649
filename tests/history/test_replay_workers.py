"""A replay never delays allocation (issue 39, "Done when" 4), with real Celery workers: an allocation worker
(``--pool solo``) and a replay worker on the run's own replay queue. While a replay of a busy day runs on the
replay worker, a canary claim is allocated in < 2 s; the replay then stops at its CPU budget (Failed, saying so),
and only the replay worker ran it. The day (40,000 claims of 1-8 GPUs on 128 GPUs) needs ~9 s of CPU to replay
(a day of the benchmarks' 1,024-GPU fleet ~10 s: ``benchmarks/replay_day_bench.py``); its budget here is 2 s."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from claims.models import ClaimHistory, Phase, ResourceClaim
from draservice.models import AuditEvent
from scheduler.models import Replay, ReplayState
from tests.claims.fleet import gpu_claim, load_fleet
from tests.claims.workers import ROOT, WorkerPool
from tests.queues.conftest import queue_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 1  # allocation workers (read by the worker_pool fixture)


class ReplayWorker(WorkerPool):
    """One replay worker as deployed (``-Q <replay queue>``)."""

    def start(self, n: int = 1) -> None:
        log = Path(f"/tmp/replay-worker-{self.queue}.log")
        env = {**self.env(0), "CLAIMS_TEST_QUEUE": self.queue.removesuffix("-replay")}
        cmd = [sys.executable, "-m", "celery", "-A", "tests.claims.celery_test_app", "worker", "--pool", "solo",
               "-Q", self.queue, "-n", f"replay-{self.queue}@%h", "--without-gossip", "--without-mingle",
               "--without-heartbeat", "--loglevel", "INFO"]
        self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT))
        self.logs.append(log)
        self._wait_ready(0)


@pytest.fixture
def replay_worker(live_broker, settings):
    settings.REPLAY_QUEUE = f"{live_broker.queue}-replay"
    worker = ReplayWorker(live_broker.broker_url, queue=settings.REPLAY_QUEUE)
    worker.start()
    yield worker
    worker.stop()  # before live_broker's teardown flushes the tables under it


def busy_day(start, claims: int) -> None:
    """A day of 1-8 GPU claims with walltimes, more than the fleet holds, as the history keeps them."""
    ClaimHistory.objects.bulk_create([
        ClaimHistory(claim_uid=uuid.uuid4(), namespace="team-a", claim_name=f"h{i}", labels={},
                     spec=gpu_claim(f"h{i}", 1 + i % 8)["spec"], lease_seconds=600 + (i * 37) % 1800,
                     created_at=start + timedelta(seconds=i * 86400 / claims)) for i in range(claims)],
        batch_size=5000)


def test_a_canary_allocates_in_under_2_s_while_a_replay_runs(admin_client, live_broker, replay_worker):
    load_fleet({"c1": [("h100", 16)]})
    assert admin_client.post("/api/v1/queues", queue_body("a", namespaces=["team-a"], gpus=8),
                             format="json").status_code == 201
    start = timezone.now().replace(microsecond=0) - timedelta(days=2)
    AuditEvent.objects.filter(kind="Queue").update(at=start - timedelta(days=1))
    busy_day(start, 40_000)
    resp = admin_client.post("/api/v1/replays", {"window": {"start": start.isoformat(),
                                                            "end": (start + timedelta(days=1)).isoformat()},
                                                 "budgetSeconds": 2}, format="json")
    assert resp.status_code == 202, resp.content
    deadline = time.monotonic() + 30
    while Replay.objects.get().state == ReplayState.PENDING:
        assert time.monotonic() < deadline, replay_worker.log_tail()
        time.sleep(0.05)
    posted = time.monotonic()
    made = admin_client.post("/api/v1/namespaces/team-a/resourceclaims", gpu_claim("canary", 1), format="json")
    assert made.status_code == 201, made.content
    while ResourceClaim.objects.get(name="canary").phase != Phase.ALLOCATED:
        assert time.monotonic() - posted < 2.0, live_broker.log_tail()
        time.sleep(0.02)
    waited = time.monotonic() - posted
    assert Replay.objects.get().state == ReplayState.RUNNING, "the replay ended before the canary was allocated"
    deadline = time.monotonic() + 180
    while (replay := Replay.objects.get()).state == ReplayState.RUNNING:
        assert time.monotonic() < deadline, replay_worker.log_tail()
        time.sleep(0.2)
    assert replay.state == ReplayState.FAILED and replay.message.startswith("CPU budget exceeded"), \
        (replay.state, replay.message, (replay.results or {}).get("cpuSeconds"), (replay.results or {}).get("rounds"))
    assert replay.finished_at - replay.started_at < timedelta(seconds=30)
    assert "Task scheduler.tasks.run_replays[" in replay_worker.log_tail(100_000)
    assert "Task scheduler.tasks.run_replays[" not in live_broker.log_tail(100_000)
    print(f"canary allocated in {waited * 1000:.0f} ms while the replay ran")
