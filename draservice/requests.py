"""What every API endpoint reads from a request the same way: ``?wait=`` for long polls, JSON merge patches."""
from __future__ import annotations

import re

from draservice.problems import FieldError

# The longest long poll: a waiting request holds a web thread (gunicorn's timeout is above it).
MAX_WAIT = 120.0
_WAIT = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")


def parse_wait(value: str | None) -> float:
    """``?wait=30s`` (also ``500ms``, ``1m``, bare seconds) in seconds, capped at ``MAX_WAIT``; 400 otherwise."""
    if not value:
        return 0.0
    m = _WAIT.match(value.strip())
    if not m:
        raise FieldError([("wait", "a duration such as 30s, 500ms or 1m")], status_code=400)
    seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]
    return min(seconds, MAX_WAIT)


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch: ``null`` removes a key, objects merge, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
