"""The policy audit trail: who changed a Queue, a Reservation, a Price or a fleet-wide DeviceClass or
DeviceTaintRule, when, and what changed.

The services that write those objects call ``record`` inside the transaction of the change (so every door —
``/api/v1``, ``/k8s``, the dashboard, a management command — is covered by the one call, and a write that is
rolled back, a dry run included, leaves no event). Who: the request being served (``ActorMiddleware`` keeps it
for the duration; DRF's authentication sets ``user`` and ``auth`` on it), else whoever ``acting_as`` names (a
management command), else ``system``. What: the leaves of the recorded fields that differ, as
``{"path": "spec.weight", "before": 1.0, "after": 2.0}``; a list is one leaf (a changed quota list shows both
lists whole). Secrets are the caller's to leave out of what it passes.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from django.utils import timezone

from draservice.models import AuditEvent

CREATE, UPDATE, DELETE = "Create", "Update", "Delete"
KINDS = ("Queue", "Reservation", "Price", "DeviceClass", "DeviceTaintRule")
SHOWN = 50  # the newest events a dashboard page shows of one object
_request: contextvars.ContextVar[Any] = contextvars.ContextVar("audit_request", default=None)
_named: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("audit_actor", default=None)


class ActorMiddleware:
    """Keeps the request being served, so that ``record`` can say who made a change without every service
    taking the caller as an argument."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


@contextlib.contextmanager
def acting_as(actor: str, kind: str = "system") -> Iterator[None]:
    """Name the author of changes made outside a request (a management command, a test)."""
    token = _named.set((actor, kind))
    try:
        yield
    finally:
        _named.reset(token)


def actor() -> tuple[str, str]:
    """(actor, actor kind) of the change being made."""
    named = _named.get()
    if named is not None:
        return named
    request = _request.get()
    if request is None:
        return "system", "system"
    token = getattr(request, "auth", None)
    if token is not None and hasattr(token, "kind") and hasattr(token, "name"):  # an API token (inventory's)
        return f"token:{token.name}", str(token.kind)
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.get_username()}", "user"
    return "system", "system"


def diff(before: Any, after: Any, path: str = "") -> list[dict]:
    """The leaves that differ between two JSON values, in key order; a dict on both sides is walked, anything
    else (a list, a scalar, a dict against a non-dict) is one leaf."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[dict] = []
        for key in sorted(set(before) | set(after), key=str):
            out.extend(diff(before.get(key), after.get(key), f"{path}.{key}" if path else str(key)))
        return out
    if before == after and isinstance(before, bool) == isinstance(after, bool):
        return []
    return [{"path": path, "before": before, "after": after}]


def record(kind: str, name: str, operation: str, before: dict | None, after: dict | None) -> AuditEvent | None:
    """One event for a change of ``kind``/``name``: ``before`` and ``after`` are the recorded fields (None for
    the side that does not exist). An update that changes none of them records nothing. Call it inside the
    change's transaction."""
    changes = diff(before or {}, after or {})
    if operation == UPDATE and not changes:
        return None
    who, who_kind = actor()
    return AuditEvent.objects.create(at=timezone.now(), actor=who[:160], actor_kind=who_kind[:16], kind=kind,
                                     name=name, operation=operation, changes=changes)


def rendered(event: AuditEvent) -> dict:
    return {"id": str(event.id), "time": event.at.isoformat().replace("+00:00", "Z"),
            "actor": {"name": event.actor, "kind": event.actor_kind},
            "object": {"kind": event.kind, "name": event.name}, "operation": event.operation,
            "changes": event.changes}


def events(kind: str, name: str | None = None, limit: int = SHOWN) -> list[dict]:
    """The newest ``limit`` events of ``kind``/``name`` (every object of the kind: ``name`` None), newest first,
    rendered, with ``at`` (the datetime) for templates. One statement (the object index)."""
    found = AuditEvent.objects.filter(kind=kind)
    if name is not None:
        found = found.filter(name=name)
    return [rendered(e) | {"at": e.at} for e in found.order_by("-id")[:limit]]
