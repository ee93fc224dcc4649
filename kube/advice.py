"""Words kubectl prints: the manifest doctor's fix as ``Warning`` headers and in a 422's one-line message
(kubectl shows ``Status.message`` and every warning, never ``Status.details``), what replacing a
DeviceClass's selectors means, and where a token-less plain-HTTP caller should go instead."""
from __future__ import annotations

import json

from inventory.models import DeviceClass
from kube.status import KubeError

MAX_SHOWN = 120  # characters of a value quoted in a warning; the whole object is in Status.details


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


def doctor_warnings(details: dict) -> list[str]:
    """One warning per change the doctor would make (or its explanation, for a skeleton)."""
    out = [f"the manifest doctor would change {c.get('field') or 'the object'}: {c.get('why')} "
           f"(now {_short(c.get('now'))})" for c in details.get("changes") or [] if isinstance(c, dict)]
    skeleton = details.get("skeleton")
    if isinstance(skeleton, dict):
        out.append(f"the manifest doctor: {details.get('explanation')}")
        out.extend(_existing(skeleton))
    return out


def _existing(skeleton: dict) -> list[str]:
    """A skeleton DeviceClass named like one the fleet has: applying it would change that class for everyone."""
    name = (skeleton.get("metadata") or {}).get("name")
    if skeleton.get("kind") != "DeviceClass" or not name or not DeviceClass.objects.filter(name=name).exists():
        return []
    return [f'a DeviceClass "{name}" already exists in the fleet: claims can name it as it is; applying this '
            "skeleton under that name would replace its selectors for every claim"]


def _fix(details: dict) -> str:
    where = "details.rewrite" if "rewrite" in details else "details.skeleton"
    return f"{details.get('explanation')} (the v1 object is in {where}; POST /api/v1/convert answers it too)"


def doctor_message(error: KubeError) -> str:
    """The 422's message with the doctor's fix in the same line."""
    if not error.details.get("explanation") or error.code != 422:
        return error.message
    return f"{error.message}; {_fix(error.details)}"


def add_doctor_cause(error: KubeError) -> None:
    """kubectl prints an Invalid error from its causes, not its message: the fix is one more cause."""
    if not error.details.get("explanation") or error.code != 422:
        return
    changes = [c for c in error.details.get("changes") or [] if isinstance(c, dict)]
    field = str(changes[0].get("field") or "") if changes else "apiVersion"
    error.details["causes"] = [*(error.details.get("causes") or []), {
        "reason": "FieldValueInvalid", "field": field, "message": f"the manifest doctor: {_fix(error.details)}"}]


def selector_change(name: str, before: dict, after: dict) -> list[str]:
    """A DeviceClass whose selectors an update replaces: every claim of the class matches by the new ones."""
    old = (before.get("spec") or {}).get("selectors") or []
    new = (after.get("spec") or {}).get("selectors") or []
    if old == new:
        return []
    return [f'deviceclass "{name}": spec.selectors replaced (were {_short(old)}, now {_short(new)}): every claim '
            "naming this class is matched by the new selectors from now on"]


def plain_http_401(request, error: KubeError) -> None:
    """kubectl sends its token only over HTTPS: a token-less plain-HTTP request is told where to go."""
    if error.code != 401 or request.is_secure() or request.META.get("HTTP_AUTHORIZATION"):
        return
    error.message = (f"{error.message} (this is plain HTTP, where kubectl sends no token: use a kubeconfig "
                     "whose server is the service's HTTPS address, e.g. the var/kubeconfig that `make run` "
                     "writes: KUBECONFIG=var/kubeconfig kubectl ...)")
