"""A freed device is never left behind by the allocation task because another worker's wake-up step had its row
locked when the task's rounds looked (scheduler.services.wakeups: the rounds' wake-up steps skip locked offers).

The lost wake-up this pins down (seen as "GPUs free while claims wait" in tests/claims/test_concurrency.py):
worker B's wake-up step locks an offer and reads its woken claims as undecided (they are, for a moment), so it
keeps the offer for later; worker A commits those claims' decisions, and its next round's wake-up step skips the
offer B still holds, takes nothing, and A's task ends; B's task ends too. Nothing asks for another round, and the
device stays free while claims it serves wait. Here B is a second database session holding the offer's row while
the task runs: the task must wait for that row before it ends, and offer the device then.
"""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from claims.models import Phase, ReleasedDevice, ResourceClaim
from claims.services import claims as claim_services
from draservice import dispatch
from draservice.runner import PeriodicRunner
from scheduler.services import allocation
from scheduler.tasks import allocate_pending
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

HOLD_SECONDS = 20.0  # the holder's limit, far above what the task needs either way


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


class OfferHolder(threading.Thread):
    """Another worker's wake-up step, as far as this test matters: a session that holds every offer's row (FOR
    UPDATE) until this process's task waits for one of them, or has ended."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.locked = threading.Event()
        self.task_done = threading.Event()
        self.waited_for = False

    def run(self) -> None:
        try:
            with transaction.atomic():
                assert list(ReleasedDevice.objects.select_for_update())
                self.locked.set()
                deadline = time.monotonic() + HOLD_SECONDS
                while not self.task_done.is_set() and time.monotonic() < deadline:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_stat_activity "
                                       "WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid)))")
                        if cursor.fetchone()[0]:
                            self.waited_for = True
                            break
                    time.sleep(0.01)
        finally:
            self.locked.set()
            connection.close()


def test_the_task_offers_a_freed_device_whose_row_another_wake_up_step_held_when_its_rounds_looked():
    load_fleet({"c1": [("h100", 1)]})  # 8 GPUs
    claim_services.create_claims("team-a", [gpu_claim(f"h-{i}") for i in range(8)])
    run_rounds()
    claim_services.create_claims("team-a", [gpu_claim("waiter")])
    run_rounds()
    assert ResourceClaim.objects.get(name="waiter").phase == Phase.PENDING
    assert not allocation.eligible_pending().exists()  # decided: only an offer of a freed device wakes it

    # The release asks for a round; the in-process runner (as under `manage.py serve`, not started here) has not
    # run it yet: the task below is that round, run while worker B's wake-up step holds the offer.
    runner = PeriodicRunner({})
    dispatch.add_local_runner(runner)
    try:
        claim_services.release_claim(ResourceClaim.objects.get(name="h-0").id)
    finally:
        dispatch.remove_local_runner(runner)
    holder = OfferHolder()
    holder.start()
    assert holder.locked.wait(10)
    try:
        allocate_pending()
    finally:
        holder.task_done.set()
        holder.join(HOLD_SECONDS + 5)

    waiter = ResourceClaim.objects.get(name="waiter")
    assert waiter.phase == Phase.ALLOCATED, (
        f"the freed GPU was left behind while the waiter waits ({waiter.phase}, {waiter.reason}); offers left: "
        f"{list(ReleasedDevice.objects.values_list('device', 'woken'))}")
    assert holder.waited_for, "the task never waited for the held offer: this run did not test the race"
    assert not ReleasedDevice.objects.exists()
