"""Two deployments sharing one Redis (server or database): each has its own pub/sub channel and debounce keys,
so neither wakes the other's waiters nor silences the other's allocation kicks. Real Redis (TEST_BROKER_URL)."""
from __future__ import annotations

import os
import time

import pytest
import redis

from claims import dispatch
from draservice import dispatch as dispatch_core
from draservice import notify
from gangs import dispatch as gang_dispatch

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(settings):
    url = os.environ.get("TEST_BROKER_URL")
    if not url:
        pytest.fail("TEST_BROKER_URL is not set (make test sets it)")
    settings.CELERY_BROKER_URL = url
    return url


def deployment(settings, prefix: str) -> None:
    settings.REDIS_KEY_PREFIX = prefix


def subscribe(url: str, channel: str):
    pubsub = redis.Redis.from_url(url).pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    return pubsub


def received(pubsub, timeout=0.5) -> list:
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.05)
        if message and message["type"] == "message":
            out.append(message["data"])
    return out


def test_the_default_prefix_follows_the_database(settings):
    settings.REDIS_KEY_PREFIX = ""
    db = settings.DATABASES["default"]
    first = notify.key_prefix()
    assert first.startswith("draservice:") and first == notify.key_prefix()
    saved = db["NAME"]
    try:
        db["NAME"] = "another_deployment"
        assert notify.key_prefix() != first
    finally:
        db["NAME"] = saved
    settings.REDIS_KEY_PREFIX = "eu-prod"
    assert notify.key_prefix() == "eu-prod" and notify.channel() == "eu-prod:claims:changed"
    # One debounce key per deployment AND Celery queue, for every app (gangs' rule won over claims').
    queue = dispatch_core.app.conf.task_default_queue or "celery"
    assert dispatch.kick_key() == f"eu-prod:claims.tasks.allocate_pending:queued:{queue}"
    assert gang_dispatch.kick_key() == f"eu-prod:gangs.tasks.place_gangs:queued:{queue}"


def test_claim_changes_wake_only_their_own_deployment(settings, broker):
    a = subscribe(broker, "test-a:claims:changed")
    b = subscribe(broker, "test-b:claims:changed")
    deployment(settings, "test-a")
    notify.publish([41, 42])
    assert received(a) == [b"[41, 42]"] and received(b, 0.2) == []
    deployment(settings, "test-b")
    notify.publish([7])
    assert received(b) == [b"[7]"] and received(a, 0.2) == []


def test_allocation_kicks_are_debounced_per_deployment(settings, broker, monkeypatch):
    settings.DISPATCH_COALESCE_SECONDS = 0  # every request asks Redis (coalescing: the test below)
    client = redis.Redis.from_url(broker)
    keys = {}
    for name in ("test-a", "test-b"):
        deployment(settings, name)
        keys[name] = dispatch.kick_key()
    client.delete(*keys.values())
    enqueued = []
    monkeypatch.setattr(dispatch_core.app, "send_task", lambda name, *a, **k: enqueued.append(notify.key_prefix()))
    deployment(settings, "test-a")
    dispatch.request_allocation()
    dispatch.request_allocation()  # a task of A is queued and not started: debounced
    deployment(settings, "test-b")
    dispatch.request_allocation()  # B's kick is not silenced by A's key
    assert enqueued == ["test-a", "test-b"]
    dispatch.task_started()  # B's task starts: only B's key goes
    assert client.exists(keys["test-a"]) and not client.exists(keys["test-b"])
    client.delete(keys["test-a"])


def test_a_stream_of_kicks_asks_redis_at_once_then_once_for_the_rest_of_the_window(settings, broker, monkeypatch):
    settings.DISPATCH_COALESCE_SECONDS = 0.3
    deployment(settings, f"test-coalesce-{time.monotonic_ns()}")  # a key no earlier request of this process used
    asked: list[float] = []
    monkeypatch.setattr(dispatch_core, "_claim_debounce", lambda name, key: asked.append(time.monotonic()) or False)
    dispatch.request_allocation()
    assert len(asked) == 1  # the first: at once, in the caller's thread
    for _ in range(5):
        dispatch.request_allocation()
    last_request = time.monotonic()
    assert len(asked) == 1  # the others wait for the window's end
    time.sleep(0.6)
    assert len(asked) == 2 and asked[1] >= last_request  # one more, after every request it stands for
    assert asked[1] - asked[0] >= 0.3 - 0.01
    time.sleep(0.4)
    dispatch.request_allocation()  # a quiet window later: at once again
    assert len(asked) == 3
