"""Claim conditions, Kubernetes style: ``lastTransitionTime`` moves only when ``status`` changes."""
from __future__ import annotations

from datetime import datetime

ALLOCATED = "Allocated"
RELEASED = "Released"
RELEASING = "Releasing"  # True: the claim is to be released, its devices held until that is confirmed


def _ts(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list | None, type_: str, status: bool, reason: str, message: str,
                  now: datetime) -> list:
    out = [dict(c) for c in conditions or [] if c.get("type") != type_]
    old = next((c for c in conditions or [] if c.get("type") == type_), None)
    status_s = "True" if status else "False"
    changed = old is None or old.get("status") != status_s
    out.append({"type": type_, "status": status_s, "reason": reason, "message": message,
                "lastTransitionTime": _ts(now) if changed else old.get("lastTransitionTime", _ts(now))})
    return out


def set_allocated_condition(conditions, status: bool, reason: str, message: str, now: datetime) -> list:
    return set_condition(conditions, ALLOCATED, status, reason, message, now)


def is_true(conditions: list | None, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions or [])
