"""Claim-change notifications, so that ``GET …?wait=60s`` returns as soon as a claim changes.

Writers call ``publish(claim_ids)`` after their transaction commits. With Redis configured (the Celery
broker) the ids go out on one pub/sub channel; each web process runs ONE listener thread that wakes the
local waiters of those claims. Without Redis the worker runs in-process, so waking local waiters is enough.

The channel, like every Redis key of the service (``key_prefix()``), is named per deployment: Redis pub/sub
ignores the database number, so two deployments sharing a Redis server would otherwise wake each other's
waiters (and, on one database number, silence each other's debounced kicks).

Waiters never trust a notification alone: after each wake-up (and at least every ``RECHECK_SECONDS``, in
case a message was lost or Redis is down) they re-read the claim from the database. So a wait costs one
sleeping thread and a query every few seconds, not a busy loop; see ``claims.api.views`` for the thread
budget this implies for the web server.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from django.conf import settings

log = logging.getLogger(__name__)

RECHECK_SECONDS = 2.0

_lock = threading.Lock()
_waiters: dict[int, set[threading.Event]] = defaultdict(set)
_listener: threading.Thread | None = None
_subscribed = threading.Event()
_wanted = threading.Event()  # a waiter wants the subscription (set until the listener lets it go)
LINGER_SECONDS = 10.0
_redis_clients: dict[str, object] = {}


def key_prefix() -> str:
    """``settings.REDIS_KEY_PREFIX``, or one derived from the database this process uses (host, port and
    name): every process of one deployment (web, workers, beat) shares a database, and so a prefix.

    Read at each use, not at import: the test runner switches to its test database after settings load.
    """
    if settings.REDIS_KEY_PREFIX:
        return settings.REDIS_KEY_PREFIX
    db = settings.DATABASES["default"]
    identity = "|".join(str(db.get(k) or "") for k in ("HOST", "PORT", "NAME"))
    prefix = _derived_prefixes.get(identity)
    if prefix is None:  # every claim POST and release asks (kick, publish): hash each database once
        prefix = _derived_prefixes[identity] = f"draservice:{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    return prefix


_derived_prefixes: dict[str, str] = {}


def channel() -> str:
    return f"{key_prefix()}:claims:changed"


def redis_url() -> str | None:
    url = settings.CELERY_BROKER_URL or ""
    return url if url.startswith(("redis://", "rediss://", "unix://")) else None


def redis_client():
    """A process-wide Redis client for the broker URL (redis-py pools are fork- and thread-safe)."""
    url = redis_url()
    if url is None:
        return None
    client = _redis_clients.get(url)
    if client is None:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=30)
        _redis_clients[url] = client
    return client


def publish(claim_ids: Iterable[int]) -> None:
    ids = [int(i) for i in claim_ids]
    if not ids:
        return
    wake_local(ids)
    client = redis_client()
    if client is None:
        return
    try:
        for start in range(0, len(ids), 5000):
            client.publish(channel(), json.dumps(ids[start:start + 5000]))
    except Exception as exc:  # a lost notification only delays waiters until their next re-check
        log.warning("could not publish claim changes: %s", exc)


def wake_local(ids: Iterable[int]) -> None:
    with _lock:
        for claim_id in ids:
            for ev in _waiters.get(claim_id, ()):
                ev.set()


def wait_for(claim_id: int, timeout: float, check: Callable[[], object | None]) -> object | None:
    """Call ``check`` until it returns something other than None, or ``timeout`` seconds pass.

    Registers before the first check, so a change between the check and the sleep is not missed; until this
    process is subscribed (it subscribes only while someone waits) the wait until the next check is the wait for
    the subscription, so a change published before it is read by the check that follows it.
    """
    ev = threading.Event()
    with _lock:
        _waiters[claim_id].add(ev)
    subscribed = _want_subscription()
    deadline = time.monotonic() + timeout
    try:
        while True:
            result = check()
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if subscribed:
                ev.wait(min(remaining, RECHECK_SECONDS))
                ev.clear()
            else:
                subscribed = _subscribed.wait(min(remaining, RECHECK_SECONDS))
    finally:
        with _lock:
            waiters = _waiters.get(claim_id)
            if waiters is not None:
                waiters.discard(ev)
                if not waiters:
                    del _waiters[claim_id]


def start_listener(wait: float = 2.0) -> None:
    """Start this process's listener thread (``manage.py serve`` does it as each web worker starts). It is
    subscribed to the channel only while this process has waiters (and ``LINGER_SECONDS`` after the last):
    every claim change of the deployment is a message to each subscribed process, and a web process that
    nobody long-polls would spend its CPU reading them for nothing. ``wait``: how long to wait for the
    subscription when a waiter wants it."""
    global _listener
    if redis_url() is None:
        return
    with _lock:
        if _listener is not None and _listener.is_alive():
            return  # running (maybe reconnecting: waiters re-check the database meanwhile)
        _subscribed.clear()
        _listener = threading.Thread(target=_listen, name="claims-notify", daemon=True)
        _listener.start()
    if _wanted.is_set():
        _subscribed.wait(wait)


def _want_subscription() -> bool:
    """A waiter has registered: True when the listener is subscribed (a message will wake it), else ask for the
    subscription (the listener starts, or leaves its idle wait)."""
    if redis_url() is None:
        return True  # no Redis: the worker runs in this process and wakes its waiters itself (wake_local)
    with _lock:
        if _subscribed.is_set():
            return True
        _wanted.set()
    start_listener(wait=0)
    return False


def _listen() -> None:
    backoff = 0.5
    while True:
        url = redis_url()
        if url is None:
            return
        _wanted.wait()
        try:
            _subscribe_while_wanted(url)
            backoff = 0.5
        except Exception as exc:  # reconnect; waiters keep re-checking the database meanwhile
            _subscribed.clear()
            log.warning("claims notification listener: %s; reconnecting", exc)
            time.sleep(backoff)
            backoff = min(backoff * 2, 10)


def _subscribe_while_wanted(url: str) -> None:
    """Subscribe, wake the local waiters of the claims each message names, and unsubscribe once no waiter has
    been left for ``LINGER_SECONDS`` (a client that long-polls claim after claim keeps the subscription)."""
    import redis

    # Its own connection; the health check pings an idle connection so that a dead one is noticed and replaced.
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_keepalive=True, health_check_interval=30)
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(channel())
        deadline = time.monotonic() + 5
        while not _subscribed.is_set():  # Redis confirms the subscription with a message of its own
            message = pubsub.get_message(timeout=1.0)
            if message and message.get("type") == "subscribe":
                _subscribed.set()
            elif time.monotonic() > deadline:
                raise TimeoutError("no subscription confirmation from Redis")
        idle_since = time.monotonic()
        while True:
            message = pubsub.get_message(timeout=1.0)
            if message and message.get("type") == "message":
                with contextlib.suppress(ValueError, TypeError):  # not ours: nothing to wake
                    wake_local(json.loads(message["data"]))
            now = time.monotonic()
            with _lock:
                if _waiters:
                    idle_since = now
                elif now - idle_since >= LINGER_SECONDS:
                    # Under the lock a waiter registers with: one that comes now sees no subscription and asks
                    # for it again (_want_subscription), and the outer loop subscribes anew.
                    _subscribed.clear()
                    _wanted.clear()
                    return
    finally:
        pubsub.close()
        client.close()
