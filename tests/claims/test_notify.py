"""A web process reads the claim-change channel only while it has waiters (``?wait=`` long polls): every claim
change of the deployment is a message to each subscribed process. A waiter is still woken by the message, not
by its next database re-check, and a change published before the subscription is not missed. Real Redis."""
from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
import redis

from draservice import notify

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(settings, monkeypatch):
    url = os.environ.get("TEST_BROKER_URL")
    if not url:
        pytest.fail("TEST_BROKER_URL is not set (make test sets it)")
    settings.CELERY_BROKER_URL = url
    settings.REDIS_KEY_PREFIX = f"notify-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(notify, "LINGER_SECONDS", 0.3)
    # An earlier test's long polls may have left this process's listener subscribed (for its linger) to that
    # test's channel: a waiter here would trust it and never be woken. Let it go first.
    if not _until(lambda: not notify._subscribed.is_set(), 5.0):
        pytest.fail("the listener an earlier test left subscribed did not let go")
    return redis.Redis.from_url(url)


def _subscribers(client) -> int:
    return dict(client.pubsub_numsub(notify.channel()))[notify.channel().encode()]


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _wait_in_thread(claim_id: int, ready: threading.Event, timeout: float = 8.0) -> dict:
    out: dict = {}

    def run():
        started = time.monotonic()
        out["result"] = notify.wait_for(claim_id, timeout, lambda: "changed" if ready.is_set() else None)
        out["seconds"] = time.monotonic() - started

    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out


def test_subscribed_only_while_waiters_and_woken_by_the_message(deployment):
    notify.start_listener()
    time.sleep(0.3)
    assert _subscribers(deployment) == 0  # nobody waits: the deployment's changes are not this process's work
    notify.publish([1, 2, 3])

    changed = threading.Event()
    waiter = _wait_in_thread(501, changed)
    assert _until(lambda: _subscribers(deployment) == 1, 3.0)
    time.sleep(0.1)  # the waiter's check after the subscription has run: the message is what must wake it
    changed.set()
    published = time.monotonic()
    notify.publish([501])
    waiter["thread"].join(5)
    assert waiter["result"] == "changed"
    # well before the waiter's next re-check of the database (RECHECK_SECONDS): the message woke it
    assert time.monotonic() - published < notify.RECHECK_SECONDS / 2

    assert _until(lambda: _subscribers(deployment) == 0, 3.0)  # the last waiter gone, past LINGER_SECONDS


def test_a_change_before_the_subscription_is_read_by_the_check_after_it(deployment, monkeypatch):
    notify.start_listener()
    assert _until(lambda: _subscribers(deployment) == 0, 3.0)
    changed = threading.Event()
    checks = []
    subscribe = notify._subscribe_while_wanted

    def late(url):  # the change lands while the subscription is being made
        changed.set()
        checks.append(time.monotonic())
        return subscribe(url)

    monkeypatch.setattr(notify, "_subscribe_while_wanted", late)
    waiter = _wait_in_thread(502, changed)
    waiter["thread"].join(5)
    assert waiter["result"] == "changed" and checks
    # read by the check that follows the subscription, not by a re-check RECHECK_SECONDS later
    assert waiter["seconds"] < notify.RECHECK_SECONDS / 2
