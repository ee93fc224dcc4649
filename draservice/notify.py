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

    Registers before the first check, so a change between the check and the sleep is not missed.
    """
    ev = threading.Event()
    with _lock:
        _waiters[claim_id].add(ev)
    _ensure_listener()
    deadline = time.monotonic() + timeout
    try:
        while True:
            result = check()
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ev.wait(min(remaining, RECHECK_SECONDS))
            ev.clear()
    finally:
        with _lock:
            waiters = _waiters.get(claim_id)
            if waiters is not None:
                waiters.discard(ev)
                if not waiters:
                    del _waiters[claim_id]


def start_listener(wait: float = 2.0) -> None:
    """Start this process's listener (``manage.py serve`` does it as each web worker starts) and wait until
    it is subscribed: a change published before the subscription would otherwise be seen only at the
    waiters' next database re-check."""
    global _listener
    if redis_url() is None:
        return
    with _lock:
        if _listener is not None and _listener.is_alive():
            return  # running (maybe reconnecting: waiters re-check the database meanwhile)
        _subscribed.clear()
        _listener = threading.Thread(target=_listen, name="claims-notify", daemon=True)
        _listener.start()
    _subscribed.wait(wait)


def _ensure_listener() -> None:
    start_listener()


def _listen() -> None:
    import redis

    backoff = 0.5
    while True:
        url = redis_url()
        if url is None:
            return
        try:
            # Its own connection without a read timeout (it blocks until a message comes); the health check
            # pings an idle connection so that a dead one is noticed and replaced.
            client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_keepalive=True,
                                          health_check_interval=30)
            pubsub = client.pubsub()
            pubsub.subscribe(channel())
            deadline = time.monotonic() + 5
            while not _subscribed.is_set():  # Redis confirms the subscription with a message of its own
                message = pubsub.get_message(timeout=1.0)
                if message and message.get("type") == "subscribe":
                    _subscribed.set()
                elif time.monotonic() > deadline:
                    raise TimeoutError("no subscription confirmation from Redis")
            backoff = 0.5
            for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                try:
                    wake_local(json.loads(message["data"]))
                except (ValueError, TypeError):
                    continue
        except Exception as exc:  # reconnect; waiters keep re-checking the database meanwhile
            _subscribed.clear()
            log.warning("claims notification listener: %s; reconnecting", exc)
            time.sleep(backoff)
            backoff = min(backoff * 2, 10)
