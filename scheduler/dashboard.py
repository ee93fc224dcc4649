"""The dashboard's Replays pages (admins: a replay shows every queue's figures): the replays, newest first, with the
form that starts one, and a replay beside what happened, per queue and per reservation, with the configurations
it used.

A replay's figures are read from the Replay resource as the API renders it (``replays.rendered``), so the page
and ``GET /api/v1/replays/{name}`` cannot disagree. The form's inputs become the API's body (``ReplayForm.body``),
which the service checks as it checks the API's; its errors name the body's fields, and ``ReplayForm.refused``
puts each one beside the input it came from.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta

from django.conf import settings
from django.core.paginator import Paginator
from django.http import QueryDict
from django.utils import timezone

from draservice.errors import Invalid, ServiceError
from queues.models import Queue
from scheduler.models import Replay, ReplayState
from scheduler.services import replays

PAGE_SIZE = 25
ISO = replays.ISO
_QUEUE_ITEM = re.compile(r"^configuration\.queues\[(\d+)\]")


# ------------------------------------------------------------------------------------------------ the list

def replay_list(page_number: str | None) -> dict:
    """A page of replays, newest first (their results, which can be long, left unread)."""
    paginator = Paginator(Replay.objects.defer("results").order_by("-id"), PAGE_SIZE)
    page = paginator.get_page(page_number)
    return {"page": page, "rows": [{"replay": r, "overrides": overrides(r.configuration)} for r in page],
            "history_days": settings.HISTORY_DAYS, "max_days": replays.MAX_WINDOW.days}


def overrides(configuration: dict | None) -> list[dict]:
    """A replay's overrides, one per object: ``{"kind", "name", "patch"}`` (the patch as compact JSON)."""
    out = []
    for key, kind in (("queues", "Queue"), ("reservations", "Reservation")):
        for item in (configuration or {}).get(key) or []:
            out.append({"kind": kind, "name": item.get("name"), "patch": _json(item.get("spec"))})
    return out


class ReplayForm:
    """The "what if" form: the window (RFC 3339, as the API takes it), a CPU budget, a weight per queue and,
    for anything else the API accepts, a ``configuration`` object as JSON. A weight given for a queue is a merge
    patch ``{"weight": w}`` put after the JSON's own queue patches (so it wins over them)."""

    def __init__(self, data: QueryDict | None = None, now: datetime | None = None):
        self.queues = list(Queue.objects.order_by("name").values_list("name", "weight"))
        if data is None:
            end = (now or timezone.now()).replace(second=0, microsecond=0)
            data = QueryDict(mutable=True)
            data.update({"start": (end - timedelta(days=1)).strftime(ISO), "end": end.strftime(ISO)})
        self.data = data
        self.errors: dict[str, list[str]] = {}  # input name -> reasons
        self.problems: list[dict] = []  # the service's refusal: [{"field", "reason"}], or one message below
        self.message = ""
        self._weights: list[str] = []  # the queues whose weight input made an override, in body order
        self._json_queues = 0  # queue patches the JSON brought, before the weights' ones

    def value(self, name: str) -> str:
        return str(self.data.get(name, ""))

    def weight_rows(self) -> list[dict]:
        return [{"name": n, "weight": w, "input": f"weight:{n}", "value": self.value(f"weight:{n}"),
                 "errors": self.errors.get(f"weight:{n}", [])} for n, w in self.queues]

    def body(self) -> dict:
        """The API body of what the form says; Invalid (naming ``configuration``) when its JSON is not JSON."""
        body: dict = {"window": {"start": self.value("start").strip(), "end": self.value("end").strip()}}
        if self.value("budgetSeconds").strip():
            body["budgetSeconds"] = _number(self.value("budgetSeconds").strip())
        configuration: dict = {}
        raw = self.value("configuration").strip()
        if raw:
            try:
                configuration = json.loads(raw, parse_constant=_no_constant)
            except ValueError as exc:
                raise Invalid([("configuration", f"Invalid value: not JSON: {exc}")]) from exc
            if not isinstance(configuration, dict):
                body["configuration"] = configuration  # the service says what it must be
                return body
        queues = configuration.get("queues")
        self._json_queues = len(queues) if isinstance(queues, list) else 0
        weights = [(n, self.value(f"weight:{n}").strip()) for n, _ in self.queues]
        weights = [(n, w) for n, w in weights if w]
        if weights and (queues is None or isinstance(queues, list)):
            self._weights = [n for n, _ in weights]
            configuration["queues"] = list(queues or []) + [{"name": n, "spec": {"weight": _number(w)}}
                                                            for n, w in weights]
        if configuration:
            body["configuration"] = configuration
        return body

    def refused(self, exc: ServiceError) -> ReplayForm:
        """Put the service's refusal beside the inputs: ``window.start`` at the start, the override of a queue
        the form added at its weight, the rest of ``configuration`` at the JSON."""
        self.problems, self.message = exc.errors, ("" if exc.errors else exc.detail)
        for error in exc.errors:
            self.errors.setdefault(self._input_of(str(error["field"])), []).append(
                f"{error['field']}: {error['reason']}" if error["field"] else error["reason"])
        return self

    def _input_of(self, field: str) -> str:
        if field.startswith("window"):
            return "end" if field.startswith("window.end") else "start"
        found = _QUEUE_ITEM.match(field)
        if found and int(found.group(1)) >= self._json_queues \
                and int(found.group(1)) - self._json_queues < len(self._weights):
            return f"weight:{self._weights[int(found.group(1)) - self._json_queues]}"
        if field.startswith("configuration"):
            return "configuration"
        return field if field == "budgetSeconds" else ""


def _number(text: str) -> int | float | str:
    """A number typed into an input; anything else as typed (the service names the field). "nan" and "inf" are
    not numbers here: JSON has none (as the API's parser, which refuses them)."""
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if math.isfinite(number) else text
    return text


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


# ------------------------------------------------------------------------------------------------ one replay

def replay_page(name: str) -> dict:
    """One replay as the API renders it (NotFound: no such replay), and its figures shaped for the tables."""
    doc = replays.rendered(replays.get(name))
    results = doc["status"]["results"] or {}
    return {"doc": doc, "state": doc["status"]["state"],
            "waiting": doc["status"]["state"] in (ReplayState.PENDING, ReplayState.RUNNING),
            "overrides": overrides(doc["spec"]["configuration"]),
            "queues": [{"name": q["name"], "sides": (_figures(q["actual"]), _figures(q["replayed"]))}
                       for q in results.get("queues") or []],
            "reservations": [{"name": r["name"], "booked": r["bookedDeviceHours"],
                              "actual": _percent(r["actual"]["utilisation"]),
                              "replayed": _percent(r["replayed"]["utilisation"])}
                             for r in results.get("reservations") or []],
            "configurations": _configurations(results.get("configurations") or []),
            "results": results}


def _figures(figures: dict) -> dict:
    return {"claims": figures["claims"], "started": figures["started"], "preemptions": figures["preemptions"],
            "p50": _wait(figures["waitP50Seconds"]), "p95": _wait(figures["waitP95Seconds"]),
            "share": _percent(figures["shareOfDeviceHours"]), "deviceHours": figures["deviceHours"]}


def _wait(seconds: float | None) -> dict:
    """``value``: the API's seconds; ``text``: for people (seconds below a minute, else two units)."""
    if seconds is None:
        return {"value": None, "text": "—"}
    if seconds < 60:
        return {"value": seconds, "text": f"{seconds:g} s"}
    if seconds < 3600:
        big, small = (int(seconds // 60), "m"), (int(seconds % 60), "s")
    elif seconds < 86400:
        big, small = (int(seconds // 3600), "h"), (int(seconds % 3600 // 60), "m")
    else:
        big, small = (int(seconds // 86400), "d"), (int(seconds % 86400 // 3600), "h")
    text = f"{big[0]}{big[1]}" + (f" {small[0]}{small[1]}" if small[0] else "")
    return {"value": seconds, "text": text}


def _percent(fraction: float | None) -> dict:
    return {"value": fraction, "text": "—" if fraction is None else f"{fraction * 100:.2f} %"}


def _configurations(epochs: list[dict]) -> list[dict]:
    """The queues' policy in force from each moment: one row per queue of each epoch."""
    return [{"from": e["from"], "queues": [{"name": name, "weight": spec.get("weight"),
                                            "fairSharing": _json(spec.get("fairSharing")),
                                            "quotas": _json(spec.get("quotas"))}
                                           for name, spec in e["queues"].items()]}
            for e in epochs]


def _json(value) -> str:
    return "—" if value is None else json.dumps(value, sort_keys=True, separators=(", ", ": "))
