"""Queue guarantees under contention (issue 30, "Done when"), against a live service: ``manage.py serve``,
Celery workers (2 processes) and beat, PostgreSQL, Redis; everything through the HTTP API, outcomes read in SQL.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice BENCH_BROKER_URL=redis://127.0.0.1:6379/6 \\
        .venv/bin/python benchmarks/queue_scenarios.py [--small] [--only NAME,...]

Creates (and drops) the database ``<DATABASE_URL's name>_queue_scenarios``; the broker's Redis database is
FLUSHED (the benchmark owns it). Prints met/MISSED per figure, each with its expected number; timing figures
carry the load average. ``--small`` runs each scenario once, small (what tests/queues/test_queue_scenarios.py
runs in ``make test``). Exit status 1 when a figure is MISSED.

Scenarios (their docstrings state the expected numbers): reclaim of 2, 4, 6 GPUs from a borrowing queue, its
MIG-memory and gang-victim variants, the parent/child tree with and without ``lendingLimit: 0``, a 2x8 gang at
the head of its queue while a borrowing queue keeps submitting, simulate against what the worker then does, and
time to the first notice beside 2,000 unsatisfiable claims of another tenant. Not here yet: fair-share
preemption (weights 1:1 and 3:1 over 10 minutes).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import _queue_cases as cases  # noqa: E402
from benchmarks._queue_world import World, gpu_claim, queue_body  # noqa: E402

PASS_SECONDS = cases.PASS_SECONDS


def gang_head(w: World) -> None:
    """Two 8-GPU nodes held by 16 one-GPU claims of ``default`` (nominal 0: above its nominal). team-g (nominal
    16, reclaim off: it waits for releases) submits a 2x8 gang, the head of its queue. Then, one after the
    other, each of default's claims is released and a new one-GPU claim of ``default`` submitted. Expected:
    none of those later claims is allocated while the gang waits (they may not take the devices its hold
    covers), and the gang is placed within 2 s of the release that freed its last device."""
    s = "gang-head"
    w.reset([("h100", 2)])
    w.queue(queue_body("team-g", namespaces=["g"], gpus=16,
                       preemption={"reclaimWithinCohort": "Never", "withinQueue": "Never"}))
    for i in range(16):
        w.claim("ci", f"{s}-ci{i}")
    assert w.wait(lambda: w.allocated("ci") == 16, 30) is not None, "the borrower did not fill the fleet"
    w.gang("g", s, 2, 8)
    time.sleep(1)
    for i in range(16):
        w.call("DELETE", f"/api/v1/namespaces/ci/resourceclaims/{s}-ci{i}")
        w.claim("ci", f"{s}-late{i}")
        time.sleep(0.1 if w.small else 0.3)
    placed = w.wait(lambda: w.allocated("g") == 2, 15 if w.small else 30)
    from claims.models import ResourceClaim
    from gangs.models import Gang

    gang = Gang.objects.filter(namespace__name="g", name=s).first()
    late = ResourceClaim.objects.filter(namespace__name="ci", name__startswith=f"{s}-late", phase="Allocated")
    if placed is not None:
        g_at = min(ResourceClaim.objects.filter(namespace__name="g", phase="Allocated")
                   .values_list("allocated_at", flat=True))
        late = late.filter(allocated_at__lt=g_at)
    w.equal(s, "later default claims allocated before the gang", late.count(), 0)
    w.at_most(s, "seconds from the last release to the gang placed", placed, 2.0)
    if gang is not None and placed is None:
        print(f"    gang {gang.phase} {gang.reason}: {gang.message[:160]}")


def simulate_agrees(w: World) -> None:
    """One 8-GPU node; team-q {nominal 2, borrowingLimit 0}. Three one-GPU claims in turn: each is simulated
    (POST /api/v1/simulate against the stored fleet) and then submitted. Expected: simulate's answer (allocated
    or not, and the reason) is what the worker then does: allocated, allocated, WaitingForQuota."""
    s = "simulate"
    w.reset([("h100", 1)])
    w.queue(queue_body("team-q", namespaces=["q"], gpus=2, borrowing=0))
    for i in range(3):
        name = f"{s}-{i}"
        body = gpu_claim(name)
        body["metadata"]["namespace"] = "q"
        sim = w.call("POST", "/api/v1/simulate", {"claims": [body]})
        w.claim("q", name)
        from claims.models import ResourceClaim

        def decided(name=name):
            c = ResourceClaim.objects.filter(namespace__name="q", name=name).first()
            return c is not None and (c.phase != "Pending" or c.reason not in ("", "WaitingForAllocation"))

        w.wait(decided, 15)
        c = ResourceClaim.objects.get(namespace__name="q", name=name)
        worker = (c.phase == "Allocated", "" if c.phase == "Allocated" else c.reason)
        said = (bool(sim.get("allocated")), "" if sim.get("allocated") else sim.get("reason") or "")
        w.equal(s, f"claim {i}: simulate (allocated, reason) vs worker {worker}", said, worker)


def time_to_first_notice(namespace: str, name: str, timeout: float) -> float | None:
    from claims.models import ResourceClaim
    from queues.models import Preemption

    if World.wait(lambda: cases.notices_for(namespace, name) > 0, timeout) is None:
        return None
    claim = ResourceClaim.objects.get(namespace__name=namespace, name=name)
    first = Preemption.objects.filter(preemptor=claim).order_by("created_at").first()
    tried = claim.last_attempt_at and round((claim.last_attempt_at - claim.created_at).total_seconds(), 2)
    print(f"    {name}: last tried by a round {tried} s after its creation")
    return (first.created_at - claim.created_at).total_seconds()


def flood(w: World, n: int) -> None:
    """Two 8-GPU nodes held by 16 one-GPU claims of ``default`` (grace 300 s: the notices run, nothing moves);
    team-a (nominal 8) asks for 4 GPUs, then ``n`` claims of another tenant that nothing can satisfy (32 GPUs
    each) are submitted and decided, then team-a asks for 4 more. Expected: 4 notices each, and the second
    claim's time from creation to its first notice <= the first's + 2 s (both include the wait for the next
    preemption pass, every 5 s)."""
    s = f"flood-{n}"
    w.reset([("h100", 2)], default_grace=300)
    w.queue(queue_body("team-a", namespaces=["a"], gpus=8))
    for i in range(16):
        w.claim("ci", f"{s}-ci{i}")
    assert w.wait(lambda: w.allocated("ci") == 16, 30) is not None, "the borrower did not fill the fleet"
    w.claim("a", f"{s}-before", 4)
    quiet = time_to_first_notice("a", f"{s}-before", 3 * PASS_SECONDS)
    from claims.models import ResourceClaim

    w.batch("flood", [gpu_claim(f"{s}-never{i}", 32) for i in range(n)])
    waited = w.wait(lambda: ResourceClaim.objects.filter(namespace__name="flood", reason="Unsatisfiable")
                    .count() >= n, 120, step=0.5)
    w.record(s, "flood claims decided Unsatisfiable", waited is not None, "True", waited is not None)
    w.claim("a", f"{s}-after", 4)
    flooded = time_to_first_notice("a", f"{s}-after", 3 * PASS_SECONDS + 10)
    w.equal(s, "notices (before, after)", (cases.notices_for("a", f"{s}-before"),
                                           cases.notices_for("a", f"{s}-after")), (4, 4))
    w.at_most(s, "quiet: seconds from creation to first notice", quiet, PASS_SECONDS + 1)
    w.at_most(s, "flooded: seconds from creation to first notice", flooded,
              (quiet if quiet is not None else 0) + 2)


def run_scenarios(w: World, only: set[str] | None = None) -> list:
    """Every scenario once (``w.small``: the small variants, one reclaim size), the flood last (its claims
    stay)."""
    plan = [("reclaim", lambda: [cases.reclaim_exact(w, n) for n in ((4,) if w.small else (2, 4, 6))]),
            ("reclaim-mig", lambda: cases.reclaim_mig(w)),
            ("reclaim-gang", lambda: cases.reclaim_gang_victims(w)),
            ("tree-lending0", lambda: cases.tree(w, 0)),
            ("tree-reclaim", lambda: cases.tree(w, None)),
            ("gang-head", lambda: gang_head(w)),
            ("fair", lambda: [cases.fair_share(w, ws) for ws in ((1, 1), (1, 3))]),
            ("simulate", lambda: simulate_agrees(w)),
            ("flood", lambda: flood(w, 200 if w.small else 2000))]
    w.ensure_classes()
    for name, run in plan:
        if only and name not in only:
            continue
        started = time.monotonic()
        print(f"{name}:", flush=True)
        run()
        print(f"    ({time.monotonic() - started:.1f} s, load {os.getloadavg()[0]:.2f})", flush=True)
    return w.figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="each scenario once, small")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
    if not base.startswith("postgres"):
        sys.exit("queue_scenarios needs PostgreSQL: set DATABASE_URL=postgresql://...")
    from benchmarks._live import Stack, bench_database, recreate_database

    name, url = bench_database(base, "queue_scenarios")
    broker = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")
    recreate_database(base, name)
    os.environ.update(DATABASE_URL=url, CELERY_BROKER_URL=broker, LOG_LEVEL="WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from draservice.models import APIToken
    from draservice.tokens import issue_token

    call_command("migrate", verbosity=0)
    _, token = issue_token(kind=APIToken.ADMIN, name="queue scenarios")
    stack = Stack(broker, web_workers=1, web_threads=8, concurrency=2, beat=True, prefix="queue_scenarios-")
    stack.start()
    try:
        figures = run_scenarios(World(stack.port, token, small=args.small),
                                set(filter(None, args.only.split(","))) or None)
    finally:
        stack.stop()
    missed = [f for f in figures if not f.met]
    print(f"\n{len(figures) - len(missed)} met, {len(missed)} MISSED")
    for f in missed:
        print(f.line())
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
