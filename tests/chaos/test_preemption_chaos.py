"""SIGKILL chaos with preemption (issue 28): two queues that lend to each other reclaim and preempt again and
again (``tests.chaos.scenario``) while Celery workers, beat and the web process are SIGKILLed and restarted.
The run counts the preemptions it exercised from the database and checks (``tests.chaos.checks``): no device
held twice at any moment, no queue over ``nominal + borrowingLimit`` at any commit, no claim lost.

The reduced run is in ``make test``; the full one (more claims, more kills, web and beat too) is ``long``."""
from __future__ import annotations

import os
import time

import pytest

from claims.models import Phase
from draservice.models import APIToken
from draservice.tokens import issue_token
from tests.chaos import checks
from tests.chaos.processes import Beat, Chaos, Web
from tests.chaos.scenario import QUEUES, Door, Plan, Run
from tests.claims.fleet import load_fleet
from tests.claims.race import settled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 2  # read by the worker_pool fixture


@pytest.fixture
def beat(live_broker, tmp_path):
    beat = Beat(live_broker, period=1.0, log=tmp_path / "beat.log")
    beat.start()
    yield beat
    beat.stop()  # before live_broker's teardown waits for the queue to drain


@pytest.fixture
def web(live_broker, tmp_path):
    web = Web(live_broker, log=tmp_path / "web.log")
    web.start()
    yield web
    web.stop()


def chaos_run(plan: Plan, door: Door, chaos: Chaos) -> tuple[Run, dict, float]:
    started = time.monotonic()
    load_fleet({f"c{i}": [("h100", plan.nodes)] for i in range(plan.clusters)})
    for ns, name in QUEUES.items():
        assert door.post("/api/v1/queues", plan.queue_body(name, ns), ok=(201, 409)) in (201, 409)
    run = Run(plan, door, chaos)
    run.start()
    for i in range(plan.cycles):
        run.cycle(i)
    chaos.join()
    run.settle(settled)
    phases = checks.assert_nothing_lost(run.created, run.released)
    return run, phases, time.monotonic() - started


def assert_no_violations(run: Run) -> dict[str, int]:
    limit = run.plan.nominal + run.plan.borrowing
    assert set(checks.UNIQUE_INDEXES) <= checks.unique_indexes()
    assert checks.doubles_now() == [] and checks.doubles_in_history() == []
    assert checks.early_handovers() == []  # a victim's devices moved only once it stopped, or at its forceAt
    peaks = checks.peaks_in_history(list(QUEUES.values()))
    # Each queue borrowed up to its limit (the ledger saw it) and never beyond, at any commit.
    assert peaks == {q: limit for q in QUEUES.values()}, peaks
    assert run.peaks == {q: limit for q in QUEUES.values()}, run.peaks
    return peaks


def assert_cycles(run: Run) -> None:
    """Every cycle: each device the borrower borrowed was reclaimed (one victim each), and the urgent claim made
    a claim give way (within its queue; or, after an extra victim of overlapping passes had left its queue
    under nominal, from the other queue). No notice is left outstanding."""
    for i, cycle in enumerate(run.per_cycle):
        assert cycle["reclaim"] >= run.plan.borrowing, (i, run.per_cycle)
        assert cycle["reclaim"] + cycle["within_queue"] >= run.plan.borrowing + 1, (i, run.per_cycle)
    assert len(run.per_cycle) == run.plan.cycles and checks.preemption_counts(QUEUES)["pending"] == 0


def report(run: Run, chaos: Chaos, phases: dict, peaks: dict, wall: float) -> str:
    counts = checks.preemption_counts(QUEUES)
    kills = ", ".join(f"{k.what} at {k.at:.1f} s ({'in a transaction, ' if k.in_transaction else ''}"
                      f"back after {k.down:.1f} s)" for k in chaos.kills)
    return (f"\n{len(run.created)} claims, {run.plan.cycles} cycles, {len(chaos.kills)} kills: {kills}\n"
            f"preemptions exercised: {counts['marked']} notices ({counts['reclaim']} reclaim, "
            f"{counts['within_queue']} within a queue), {counts['requeued']} requeued, {checks.extra_victims()} "
            f"extra victims of overlapping passes; per cycle {run.per_cycle}\n"
            f"violations: 0 double (ledger and rows), 0 over quota (ledger peaks {peaks}, sampled {run.peaks} in "
            f"{run.samples} samples), 0 lost; final phases {phases}; HTTP retries {run.door.retries}\n"
            f"wall {wall:.1f} s, load {os.getloadavg()[0]:.2f}")


def test_preemption_under_worker_and_beat_kills(admin_client, live_broker, beat):
    """2 queues of 8 GPUs (borrowing 4) on 16 GPUs, 3 cycles, ~60 claims, grace 1 s; a worker killed while a
    burst reclaims, beat killed while the urgent claim's victim has its notice, the other worker likewise."""
    plan = Plan(nodes=2, clusters=1, cycles=3, kills={(0, 3): ["worker 0"], (1, 4): ["beat"], (2, 4): ["worker 1"]})
    chaos = Chaos(live_broker, beat)
    run, phases, wall = chaos_run(plan, Door(client=admin_client), chaos)
    print(report(run, chaos, phases, assert_no_violations(run), wall))
    counts = checks.preemption_counts(QUEUES)
    assert_cycles(run)
    assert counts["marked"] == counts["requeued"] + counts["cancelled"], counts
    # Each cycle frees 5 devices by preemption (a burst of 4 beyond nominal, one urgent claim); a victim taken
    # by overlapping passes beyond one per preemptor may serve another preemptor, whose own notice is then
    # cancelled (re-check): so at least 5 a cycle are requeued, and at most those plus the extra ones.
    assert 5 * plan.cycles <= counts["requeued"] <= 5 * plan.cycles + checks.extra_victims(), counts
    assert [k.what for k in chaos.kills] == ["worker 0", "beat", "worker 1"]
    assert phases[Phase.ALLOCATED] == 16, phases  # the fleet is full at the end, 1 GPU a claim


@pytest.mark.long
def test_preemption_under_worker_beat_and_web_kills(live_broker, beat, web):
    """2 clusters x 2 nodes (32 GPUs), queues of 16 (borrowing 8), 12 cycles, hundreds of claims, through the
    web process over HTTP; every cycle kills something, the web process and beat included, some of them at once.

    Sized around two known bugs (strict xfails in tests/queues/test_preemption.py): 1-GPU claims only (a
    borrower's 2-GPU head holds a node against the other queue's burst, which then never reclaims), and a
    borrower's waiting claims fewer than 20 (a preemption pass looks at the 20 oldest waiting claims only)."""
    token = issue_token(kind=APIToken.ADMIN, name="chaos")[1]
    kills: dict[tuple[int, int], list[str]] = {}
    rota = [["worker 0"], ["web"], ["beat"], ["worker 1", "web"], ["worker 0", "beat"]]
    for i in range(12):
        kills[(i, 2 + i % 3)] = rota[i % len(rota)]
    plan = Plan(nodes=2, clusters=2, cycles=12, kills=kills)
    chaos = Chaos(live_broker, beat, web)
    run, phases, wall = chaos_run(plan, Door(url=web.url, token=token), chaos)
    print(report(run, chaos, phases, assert_no_violations(run), wall))
    counts = checks.preemption_counts(QUEUES)
    assert_cycles(run)
    assert counts["marked"] == counts["requeued"] + counts["cancelled"], counts
    assert counts["requeued"] >= (plan.borrowing + 1) * plan.cycles + checks.extra_victims()
    assert len(chaos.kills) == sum(len(v) for v in kills.values())
    assert phases[Phase.ALLOCATED] == 2 * plan.nominal, phases  # the fleet is full at the end, 1 GPU a claim
