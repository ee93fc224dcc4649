"""``Idempotency-Key`` on POST: the same key and body get the first answer, never a second object.

The record is inserted FIRST in the same transaction as the objects it answers for. Two concurrent first
attempts therefore collide on the unique (scope, key) index: the second blocks until the first commits,
fails, and replays the stored answer. A retry with the same key but a different body is refused with 422,
since it is almost certainly a client bug (the key was reused for another request).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from claims.models import IdempotencyRecord
from draservice.errors import BadRequest, Conflict, Invalid

RETENTION = timedelta(hours=24)
MAX_KEY_LENGTH = 255


def body_hash(body) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _replay(record: IdempotencyRecord, digest: str, refresh: Refresh | None) -> tuple[int, dict, bool]:
    if record.body_hash != digest:
        raise Invalid([("Idempotency-Key", "this key was already used with a different request body")],
                      title="Idempotency key reused")
    return record.status_code, refresh(record.response) if refresh else record.response, True


Refresh = Callable[[dict], dict]


def run(scope: str, key: str | None, body, fn: Callable[[], tuple[int, dict]], *,
        atomic: bool = True, refresh: Refresh | None = None) -> tuple[int, dict, bool]:
    """Run ``fn`` (which returns (status, body)) at most once per (scope, key). Returns (status, body, replayed).

    A replay answers the first status code with the objects as they are now: ``refresh`` re-renders the
    stored body (without it, the stored body as it was).

    ``fn`` must do its writes in the caller's transaction; this function opens it. ``atomic=False``: without a
    key and outside any transaction, ``fn`` runs as it is, for an ``fn`` that is one transaction by itself
    (it saves the BEGIN/COMMIT round trips when ``fn`` can do its work in one statement). With a key, or
    inside a caller's transaction (a savepoint then, so that an error leaves that transaction usable), there
    is a transaction as before.
    """
    if not key:
        if not atomic and not transaction.get_connection().in_atomic_block:
            status, response = fn()
            return status, response, False
        with transaction.atomic():
            status, response = fn()
        return status, response, False
    if len(key) > MAX_KEY_LENGTH:
        raise BadRequest([("Idempotency-Key", f"must be at most {MAX_KEY_LENGTH} characters")])
    digest = body_hash(body)
    existing = IdempotencyRecord.objects.filter(scope=scope, key=key,
                                                created_at__gte=timezone.now() - RETENTION).first()
    if existing is not None:
        return _replay(existing, digest, refresh)
    try:
        with transaction.atomic():
            # Only an expired record may go. A request that found no record above can get here after a
            # concurrent one committed its own: deleting that would create a second claim for one key.
            IdempotencyRecord.objects.filter(scope=scope, key=key,
                                             created_at__lt=timezone.now() - RETENTION).delete()
            record = IdempotencyRecord.objects.create(scope=scope, key=key, body_hash=digest, status_code=0,
                                                      response={})
            status, response = fn()
            if status < 400:  # errors are not remembered: the client may fix the request and retry
                record.status_code, record.response = status, response
                record.save(update_fields=["status_code", "response"])
            else:
                record.delete()
            return status, response, False
    except IntegrityError:
        pass
    existing = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
    if existing is None or existing.status_code == 0:
        raise Conflict([("Idempotency-Key", "a request with this key is still in progress; retry")],
                       title="Idempotency key in use")
    return _replay(existing, digest, refresh)


def purge_expired() -> int:
    return IdempotencyRecord.objects.filter(created_at__lt=timezone.now() - RETENTION).delete()[0]
