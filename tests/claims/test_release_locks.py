"""No statement on the release path waits on a row another release holds: 50 releases and 10 preemption moves
(``preemption.requeue``: a victim's devices freed as a release frees them) at once, each holding its transaction
open a moment before committing (as a slow commit or a busy web thread would), and a sampler on a separate
connection reading ``pg_locks`` and ``pg_stat_activity`` meanwhile: which of them wait on a row lock
(``transactionid``/``tuple``), on which table, behind which statement of which other transaction."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import claims as claim_services
from claims.services import preemption
from scheduler.services import allocation
from tests.claims.deferred import deferred
from tests.claims.fleet import gpu_claim, load_fleet
from usage.models import DecayedUsageDelta, UsageInterval
from usage.services import decay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

RELEASES = 50
MOVES = 10
HOLD_SECONDS = 0.1

RELEASE, MOVE = "draservice-release", "draservice-move"  # writers name themselves (SET LOCAL): only they count
# One row per (waiting writer, writer it waits behind): the lock type, the tables of the row locks the waiter
# holds or wants (a waiter on a transaction id holds the tuple lock of the row it waits for), both statements.
WAITING = """SELECT w.pid, w.application_name, w.wait_event,
  (SELECT string_agg(DISTINCT l.relation::regclass::text, ',') FROM pg_locks l
     WHERE l.pid = w.pid AND l.locktype = 'tuple'),
  w.query, b.application_name, b.state, b.query
FROM pg_stat_activity w CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocker(pid)
JOIN pg_stat_activity b ON b.pid = blocker.pid
WHERE w.application_name LIKE 'draservice-%%' AND w.wait_event_type = 'Lock'
  AND w.wait_event IN ('transactionid', 'tuple')"""


def sample_waits(stop: threading.Event, samples: list[list[tuple]]) -> None:
    try:
        with connections["default"].cursor() as cursor:
            while not stop.is_set():
                cursor.execute(WAITING)
                samples.append(cursor.fetchall())
                time.sleep(0.01)
    finally:
        connections["default"].close()


def named(cursor, name: str) -> None:
    # Until the commit: the round a writer asks for (run inline here, with no broker) is not the release's
    # path, and its own waits are not counted (a writer waiting on a round's row is: that is a real wait).
    cursor.execute(f"SET LOCAL application_name = '{name}'")


def release_and_hold(claim_id: int, barrier: threading.Barrier, errors: list) -> None:
    try:
        barrier.wait(timeout=30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                named(cursor, RELEASE)
            claim_services.release_claim(claim_id)
            time.sleep(HOLD_SECONDS)
    except Exception as exc:  # noqa: BLE001 -- reported by the test
        errors.append(exc)
    finally:
        connection.close()


def move_and_hold(claim_id: int, barrier: threading.Barrier, errors: list) -> None:
    """A preemption move: the victim is requeued and its devices freed, in one transaction held open."""
    try:
        barrier.wait(timeout=30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                named(cursor, MOVE)
            preemption.requeue(preemption.locked([claim_id]), "preempted by a test", timezone.now())
            time.sleep(HOLD_SECONDS)
    except Exception as exc:  # noqa: BLE001 -- reported by the test
        errors.append(exc)
    finally:
        connection.close()


def statement(sql: str) -> str:
    """A statement as the report names it: the release's one statement by what it locks, others by their start."""
    if "claims_freedcount" in sql:
        return "release statement (free_devices)"
    if sql.startswith("RELEASE SAVEPOINT"):
        return "RELEASE SAVEPOINT"
    return " ".join(sql.split())[:100]


def waits_seen(samples: list[list[tuple]]) -> tuple[int, list[str]]:
    """(most writers waiting at once, each distinct "waiter -> blocker" pattern with how often it was sampled)."""
    most = max((len({row[0] for row in rows}) for rows in samples), default=0)
    pairs = Counter(f"{app} waits ({event}, row of {tables or '?'}) in [{statement(sql)}] behind {b_app} "
                    f"({b_state}; last ran [{statement(b_sql)}])"
                    for rows in samples for _, app, event, tables, sql, b_app, b_state, b_sql in rows)
    return most, [f"{n}x {pair}" for pair, n in pairs.most_common()]


def run_writers(releases: list[int], moves: list[int]) -> tuple[list, list[list[tuple]], float]:
    barrier = threading.Barrier(len(releases) + len(moves))
    errors: list = []
    samples: list[list[tuple]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_waits, args=(stop, samples))
    sampler.start()
    workers = ([threading.Thread(target=release_and_hold, args=(i, barrier, errors)) for i in releases]
               + [threading.Thread(target=move_and_hold, args=(i, barrier, errors)) for i in moves])
    # The rounds the writers ask for are not the release path, and one process's engine cache serves one round
    # at a time (a worker or a runner runs them): the test runs them afterwards.
    with deferred():
        started = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - started
    stop.set()
    sampler.join()
    return errors, samples, elapsed


@pytest.mark.parametrize("half_life", [0, 3600], ids=["no-decay", "fair-share-decay"])
def test_fifty_releases_and_ten_preemption_moves_wait_on_no_row(half_life):
    load_fleet({"c1": [("h100", 8)]})  # 64 GPUs
    claim_services.create_claims("team-a", [gpu_claim(f"c-{i}") for i in range(RELEASES + MOVES)])
    while allocation.allocate_round().taken:
        pass
    ids = list(ResourceClaim.objects.filter(phase=Phase.ALLOCATED).order_by("id").values_list("id", flat=True))
    assert len(ids) == RELEASES + MOVES
    queues = set(UsageInterval.objects.values_list("queue", flat=True))
    assert len(queues) == 1 and "" not in queues
    if half_life:  # the one queue remembers its use: every release and move adds to its decayed usage
        with transaction.atomic():
            decay.configure(queues.pop(), half_life)
    errors, samples, elapsed = run_writers(ids[:RELEASES], ids[RELEASES:])
    assert errors == []
    assert ResourceClaim.objects.filter(id__in=ids[:RELEASES], phase=Phase.RELEASED).count() == RELEASES
    while allocation.allocate_round().taken:  # the rounds the writers asked for
        pass
    # The requeued victims are pending again, or placed again by the rounds their moves asked for.
    assert ResourceClaim.objects.filter(id__in=ids[RELEASES:], phase__in=(Phase.PENDING, Phase.ALLOCATED)) \
        .count() == MOVES
    assert len(samples) > 10  # the sampler ran while they wrote
    most, pairs = waits_seen(samples)
    assert most == 0, f"{most} writers waiting at once; " + " | ".join(pairs)
    assert elapsed < (RELEASES + MOVES) * HOLD_SECONDS / 2  # they did not queue one by one
    if half_life:
        assert DecayedUsageDelta.objects.count() == RELEASES + MOVES
