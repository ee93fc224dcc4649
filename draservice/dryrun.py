"""``dryRun=All`` on every write of both doors (``/api/v1`` and ``/k8s``), as kube-apiserver answers it.

A dry run goes through everything a write goes through - parsing, validation, defaulting, admission (queue
rules, access), the services' own checks, the rendering - and keeps nothing. The request runs in one
transaction that is rolled back whatever happens, so no row, event, change-log entry or idempotency record
survives it, and the work the services ask for after commit (``transaction.on_commit``: the allocator's kick,
pub/sub wake-ups, webhooks) is dropped with it. Before the rollback, hooks registered per kind
(``register_verdict``) may look at what the write would have stored and say what would happen next (a claim:
"would wait for quota in team-c: ..."); their words go out as ``Warning: 299`` headers, which kubectl prints.

The answer is the object as it would be stored (uid, creationTimestamp, a generated name filled in) with
``metadata.resourceVersion`` empty on a create (nothing was stored, so no version exists) and, on an update or
delete, the object's current version where the view names it (``keep_version``: the /k8s door, as upstream
answers), else empty: never the version the rolled-back write took. Any ``dryRun`` value but ``All`` is a 400.

Caches a process keeps across requests are filled only from committed reads in the services that keep them;
the few that may be filled inside a request are reset after a dry run (``register_reset``), so that an
object that never existed is not remembered either.
"""
from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import yaml
from django.db import transaction
from django.http import HttpResponse, JsonResponse

from draservice.problems import is_api_path, json_problem

log = logging.getLogger(__name__)
ALL = "All"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
K8S = "/k8s/"

Verdict = Callable[[dict], list[str]]
_verdicts: dict[str, Verdict] = {}
_resets: list[Callable[[], None]] = []


@dataclass
class DryRun:
    warnings: list[str] = field(default_factory=list)
    version: str | None = None  # the object's current resourceVersion (an update or delete), set by the view


_current: contextvars.ContextVar[DryRun | None] = contextvars.ContextVar("dry_run", default=None)


def active() -> DryRun | None:
    """The running dry run, or None for a write that keeps what it does."""
    return _current.get()


def keep_version(version: str | None) -> None:
    """An update or delete: the answer carries the object's current resourceVersion, as upstream's does. The
    first call names it (a view's read before its write; a read after the write is of what was not kept)."""
    run = _current.get()
    if run is not None and run.version is None:
        run.version = str(version or "")


def _enter_with_savepoint(self):
    """``transaction.atomic(savepoint=False)`` is how services keep their writes all-or-nothing at no cost when
    they are the outermost block; in a dry run they are not, and a failure there would leave the request's
    transaction unusable for the view's own reads after it (a 422's diagnosis, a 409's lookup). So in a dry
    run every block gets a savepoint: a failing one is undone alone, as it would have been on its own."""
    wanted = self.savepoint
    if _current.get() is not None:
        self.savepoint = True
    try:
        return _atomic_enter(self)
    finally:
        self.savepoint = wanted  # a decorator's Atomic is shared by every call


_atomic_enter = transaction.Atomic.__enter__
transaction.Atomic.__enter__ = _enter_with_savepoint  # type: ignore[method-assign]


def register_verdict(kind: str, verdict: Verdict) -> None:
    """``verdict(rendered object) -> warnings``: run before the rollback, so it reads the object as stored."""
    _verdicts[kind] = verdict


def register_reset(reset: Callable[[], None]) -> None:
    _resets.append(reset)


def requested(request) -> list[str] | None:
    """The ``dryRun`` values of a write: the query's (create, update, patch), or for a DELETE also the
    DeleteOptions body's (kubectl sends ``{"dryRun": ["All"]}`` there). None when the write is for real."""
    if not request.META.get("QUERY_STRING") and request.method != "DELETE":
        return None  # nothing to parse (a QueryDict for an empty query costs more than this whole check)
    values = request.GET.getlist("dryRun")
    if not values and request.method == "DELETE" and request.body:
        try:
            options = json.loads(request.body)
        except ValueError:
            options = None
        if isinstance(options, dict) and isinstance(options.get("dryRun"), list):
            values = [str(v) for v in options["dryRun"]]
    return values or None


def _refusal(request, values: list[str]) -> HttpResponse:
    bad = next(v for v in values if v != ALL)
    message = f'Invalid value: "{bad}": supported values: "All"'
    if request.path.startswith(K8S):
        return JsonResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                             "message": f"dryRun: {message}", "reason": "BadRequest", "code": 400,
                             "details": {"causes": [{"reason": "FieldValueNotSupported", "message": message,
                                                     "field": "dryRun"}]}}, status=400)
    return json_problem(400, "Bad Request", f"dryRun: {message}", [{"field": "dryRun", "reason": message}])


class DryRunMiddleware:
    """Runs a write with ``dryRun`` in a transaction that is always rolled back (see the module's doc)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method not in WRITE_METHODS or not (is_api_path(request.path) or request.path.startswith(K8S)):
            return self.get_response(request)
        values = requested(request)
        if values is None:
            return self.get_response(request)
        if any(v != ALL for v in values):
            return _refusal(request, values)
        run = DryRun()
        token = _current.set(run)
        try:
            with transaction.atomic():
                try:
                    response = self.get_response(request)
                    body = _body(response)
                    if body is not None and response.status_code < 300:
                        run.warnings.extend(_verdict(body))
                finally:
                    transaction.set_rollback(True)
        finally:
            _current.reset(token)
            for reset in _resets:
                reset()
        return _answer(request, response, body, run)


def _verdict(body: dict) -> list[str]:
    items = body.get("items")
    objects = items if isinstance(items, list) else [body]
    out: list[str] = []
    for obj in objects:
        verdict = _verdicts.get(str(obj.get("kind") or "")) if isinstance(obj, dict) else None
        if verdict is not None:
            try:
                out.extend(verdict(obj))
            except Exception:  # a verdict is advice: its failure must not turn a valid dry run into a 500
                log.exception("dry-run verdict for %s failed", obj.get("kind"))
    return out


def _body(response) -> dict | None:
    if getattr(response, "streaming", False) or not response.content:
        return None
    content_type = response.get("Content-Type", "")
    try:
        body = yaml.safe_load(response.content) if "yaml" in content_type else json.loads(response.content)
    except (ValueError, yaml.YAMLError):
        return None
    return body if isinstance(body, dict) else None


def _unversioned(obj: dict, version: str) -> None:
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "resourceVersion" in meta:
        meta["resourceVersion"] = version


def _answer(request, response, body: dict | None, run: DryRun) -> HttpResponse:
    """The rendered answer with the versions of what was not stored, and the verdicts as warnings."""
    if body is not None and response.status_code < 300 and body.get("kind") != "Status":
        version = "" if request.method == "POST" else (run.version or "")
        _unversioned(body, version)
        items = body.get("items")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                _unversioned(item, version)
        content_type = response.get("Content-Type", "")
        if "yaml" in content_type:
            response.content = yaml.safe_dump(body, sort_keys=False, allow_unicode=True).encode()
        else:
            response.content = json.dumps(body, separators=(",", ":")).encode()
        if "ETag" in response:
            del response["ETag"]  # the version it names was never stored
    for warning in run.warnings:
        add_warning(response, warning)
    return response


def add_warning(response, text: str) -> None:
    """One more ``Warning: 299 - "..."`` (HTTP allows the header repeated or comma-joined; Django keeps one
    value per name, so they are joined)."""
    # ASCII: header values are Latin-1 on the wire (Django MIME-encodes anything else, which no client decodes),
    # and clients read the bytes as UTF-8.
    plain = text.replace("…", "...").replace("→", "->").encode("ascii", "replace").decode("ascii")
    quoted = plain.replace("\\", "\\\\").replace('"', '\\"')
    value = f'299 - "{quoted}"'
    response["Warning"] = f"{response['Warning']}, {value}" if "Warning" in response else value
