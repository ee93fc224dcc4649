"""Replays as a service: ``POST /api/v1/replays`` stores a ``Replay`` (Pending) and hands it to a replay worker;
the worker replays the window (``replay_trace`` + ``replay_sim``) and stores the comparison.

Off the allocation path: with a broker the task goes to ``REPLAY_QUEUE``, which only replay workers consume
(``celery worker -Q replay``; compose's ``replay-worker``); without one (``make run``) ``manage.py serve``'s
replay runner, a thread of its own, runs it (``draservice.runner``). A replay stops as Failed once it has used
its CPU budget (``budgetSeconds``, at most ``REPLAY_CPU_SECONDS``). At most ``MAX_ACTIVE`` replays wait or run
at once; more are refused (409) rather than queued without bound.

Body: ``{"window": {"start", "end"}, "configuration": {"queues": [{"name", "spec": <merge patch>}],
"reservations": [{"name", "spec": <merge patch>}]}, "budgetSeconds"}``. An override patches the spec of the
named object for the whole window (a queue or reservation that did not exist gets the patch as its spec).
"""
from __future__ import annotations

import copy
import logging
import statistics
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from claims.services import fleet
from dra import windows
from draservice import dispatch
from draservice.celery import app
from draservice.errors import Conflict, Invalid, NotFound
from draservice.permissions import Access
from draservice.requests import merge_patch
from queues import reservation_spec
from queues import spec as queue_spec
from queues.services.resolve import queue_of
from scheduler.models import Replay, ReplayState
from scheduler.services import replay_sim, replay_trace
from usage import usage_sql

log = logging.getLogger(__name__)

RUN_TASK = "scheduler.tasks.run_replays"
MAX_ACTIVE = 4
MAX_WINDOW = timedelta(days=7)
ISO = "%Y-%m-%dT%H:%M:%SZ"
KINDS = {"queues": (queue_spec, queue_spec.KIND), "reservations": (reservation_spec, reservation_spec.KIND)}


def may_read(access: Access) -> bool:
    """Replays show every queue's figures: admins read them (read-only admin tokens too, staff sessions)."""
    return access.is_admin


def may_start(access: Access) -> bool:
    """A replay takes a replay worker's CPU: writing admins (admin tokens that are not read-only, staff)."""
    return access.can_write_fleet


def create(body: Any, author: str) -> Replay:
    window, configuration, budget = _valid(body)
    with transaction.atomic():
        active = Replay.objects.select_for_update().filter(state__in=[ReplayState.PENDING, ReplayState.RUNNING])
        if len(active) >= MAX_ACTIVE:
            raise Conflict(f"{MAX_ACTIVE} replays are waiting or running already; try again when one has finished")
        replay = Replay.objects.create(window_start=window[0], window_end=window[1], configuration=configuration,
                                       budget_seconds=budget, author=author[:160])
        transaction.on_commit(kick)
    return replay


def kick() -> None:
    """Get the replays going, off the allocation path (see the module docstring). Never raises."""
    try:
        if settings.CELERY_BROKER_URL:
            app.send_task(RUN_TASK, queue=settings.REPLAY_QUEUE)
        else:
            dispatch.request_task(RUN_TASK)
    except Exception:  # a broker hiccup: the next POST, or the beat's sweep, sends it
        log.warning("replay not handed on", exc_info=True)


def get(uid: str) -> Replay:
    try:
        replay = Replay.objects.filter(uid=uid).first()
    except Exception as exc:  # not a UUID: no such replay
        raise NotFound(f'replay "{uid}" not found') from exc
    if replay is None:
        raise NotFound(f'replay "{uid}" not found')
    return replay


def _valid(body: Any) -> tuple[tuple, dict, float]:
    errors: list[tuple[str, str]] = []
    if not isinstance(body, dict):
        raise Invalid([("", "must be an object: {window: {start, end}, configuration, budgetSeconds}")])
    for key in set(body) - {"window", "configuration", "budgetSeconds"}:
        errors.append((key, f'Unsupported value: "{key}": supported values: "window", "configuration", '
                            '"budgetSeconds"'))
    raw: dict = body["window"] if isinstance(body.get("window"), dict) else {}
    if not raw:
        errors.append(("window", "Required value: {start, end} (RFC 3339 times)"))
    times = []
    for key in ("start", "end"):
        value = _time(raw.get(key))
        if raw and (value is None or value.tzinfo is None):
            errors.append((f"window.{key}", f"Invalid value: {raw.get(key)!r}: must be an RFC 3339 time with a "
                                            "zone, e.g. 2026-01-02T15:04:05Z"))
        times.append(value)
    start, end = times
    if start and end and start.tzinfo and end.tzinfo:
        if end <= start:
            errors.append(("window.end", "Invalid value: must be after window.start"))
        elif end - start > MAX_WINDOW:
            errors.append(("window.end", f"Invalid value: a window spans at most {MAX_WINDOW.days} days"))
    budget = body.get("budgetSeconds", settings.REPLAY_CPU_SECONDS)
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget <= settings.REPLAY_CPU_SECONDS:
        errors.append(("budgetSeconds", f"Invalid value: {budget!r}: a number of CPU seconds in (0, "
                                        f"{settings.REPLAY_CPU_SECONDS:g}]"))
    configuration = _configuration(body.get("configuration"), errors)
    if errors:
        raise Invalid(errors)
    return (start, end), configuration, float(budget)


def _time(raw: Any):
    try:
        return parse_datetime(raw) if isinstance(raw, str) else None
    except ValueError:  # well formed, but no such time (a 25th hour)
        return None


def _configuration(raw: Any, errors: list) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append(("configuration", "must be an object: {queues: [...], reservations: [...]}"))
        return {}
    out: dict[str, list] = {}
    for key in set(raw) - set(KINDS):
        errors.append((f"configuration.{key}", f'Unsupported value: "{key}": supported values: "queues", '
                                               '"reservations"'))
    for key, (module, _) in KINDS.items():
        items = raw.get(key) or []
        if not isinstance(items, list):
            errors.append((f"configuration.{key}", "must be a list of {name, spec}"))
            continue
        for i, item in enumerate(items):
            path = f"configuration.{key}[{i}]"
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                    or not isinstance(item.get("spec"), dict):
                errors.append((path, "must be {name, spec} with spec a merge patch of the object's spec"))
                continue
            # The patch is checked on its own here; applied to a spec of the window, it is normalized again.
            _, problems = module.normalize({"metadata": {"name": item["name"]}, "spec": item["spec"]})
            errors += [(f"{path}.{p}", reason) for p, reason in problems if p.startswith("spec")]
            out.setdefault(key, []).append({"name": item["name"], "spec": item["spec"]})
    return out


# ------------------------------------------------------------------------------------------------ running

def run_pending() -> int:
    """Run the replays waiting (oldest first), one at a time; the number run."""
    done = 0
    while True:
        stuck = timezone.now() - timedelta(seconds=2 * settings.REPLAY_CPU_SECONDS + 60)
        replay = (Replay.objects.filter(state=ReplayState.PENDING).order_by("id").first()
                  or Replay.objects.filter(state=ReplayState.RUNNING, started_at__lt=stuck).order_by("id").first())
        if replay is None:
            return done
        taken = Replay.objects.filter(id=replay.id, state=replay.state, started_at=replay.started_at).update(
            state=ReplayState.RUNNING, started_at=timezone.now())
        if taken:
            run(replay.id)
            done += 1


def run(replay_id: int) -> None:
    replay = Replay.objects.get(id=replay_id)
    try:
        results = replay_window(replay.window_start, replay.window_end, replay.configuration, replay.budget_seconds)
        state, message = ReplayState.SUCCEEDED, ""
    except replay_sim.BudgetExceeded as exc:
        results, state, message = None, ReplayState.FAILED, f"CPU budget exceeded: {exc}"
    except Exception as exc:  # whatever went wrong is this replay's failure only
        log.exception("replay %s", replay.uid)
        results, state, message = None, ReplayState.FAILED, f"error: {exc}"
    Replay.objects.filter(id=replay_id).update(state=state, message=message[:2000], results=results,
                                               finished_at=timezone.now())


def replay_window(start, end, configuration: dict, budget: float) -> dict:
    cpu = _cpu()
    trace = replay_trace.load(start, end)
    _override(trace.epochs, configuration)
    view = fleet.current_view()
    first = trace.epochs[0][1].get(queue_spec.KIND, {})
    decayed0 = {name: usage_sql.decayed_as_of(name, float(queue_spec.half_life(spec)), start)
                for name, spec in first.items() if queue_spec.half_life(spec)}
    sim = replay_sim.Replay(trace, view.snapshot, view.cluster_labels, decayed0, budget, fanout=settings.WAKE_FANOUT)
    sim.run()
    return _results(trace, sim, _cpu() - cpu)


def _cpu() -> float:
    return time.process_time()


def _override(epochs: list, configuration: dict) -> None:
    for key, (module, kind) in KINDS.items():
        for item in configuration.get(key) or []:
            for _, specs in epochs:
                current = specs.setdefault(kind, {})
                patched = merge_patch(copy.deepcopy(current.get(item["name"]) or {}), item["spec"])
                obj, problems = module.normalize({"metadata": {"name": item["name"]}, "spec": patched})
                if problems:
                    raise Invalid([(f"configuration.{key}: {item['name']}.{p}", r) for p, r in problems])
                current[item["name"]] = obj["spec"]


# ------------------------------------------------------------------------------------------------ results

def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))], 3)


def _figures(waits: list[float], seconds: float, total: float, preemptions: int, claims: int, started: int) -> dict:
    return {"waitP50Seconds": round(statistics.median(waits), 3) if waits else None,
            "waitP95Seconds": _quantile(waits, 0.95), "deviceHours": round(seconds / 3600, 4),
            "shareOfDeviceHours": round(seconds / total, 4) if total else None, "preemptions": preemptions,
            "claims": claims, "started": started}


def _results(trace, sim: replay_sim.Replay, cpu: float) -> dict:
    def first_queue(c):
        return queue_of(c, c.namespace, sim.tree)

    actual = replay_trace.actual_by_queue(trace, first_queue)
    replayed: dict[str, dict] = {}
    for s in sim.claims:
        row = replayed.setdefault(s.queue, {"waits": [], "claims": 0, "started": 0})
        row["claims"] += 1
        if s.first_start is not None:
            row["started"] += 1
            row["waits"].append(s.first_start - max(0.0, s.arrival))
    names = sorted(set(actual) | set(replayed) | set(sim.device_seconds))
    total_actual = sum(a["deviceSeconds"] for a in actual.values())
    total_replayed = sum(sim.device_seconds.values())
    queues = []
    for name in names:
        a = actual.get(name) or {"waits": [], "deviceSeconds": 0.0, "preemptions": 0, "claims": 0, "started": 0}
        r = replayed.get(name) or {"waits": [], "claims": 0, "started": 0}
        queues.append({"name": name,
                       "actual": _figures(a["waits"], a["deviceSeconds"], total_actual, a["preemptions"],
                                          a["claims"], a["started"]),
                       "replayed": _figures(r["waits"], sim.device_seconds.get(name, 0.0), total_replayed,
                                            sim.preempted.get(name, 0), r["claims"], r["started"])})
    start = trace.start

    def stamp(seconds: float) -> str:
        return (start + timedelta(seconds=seconds)).strftime(ISO)

    return {"claims": len(trace.claims), "rounds": sim.rounds, "cpuSeconds": round(cpu, 3), "queues": queues,
            "reservations": _reservations(trace, sim),
            "configurations": [{"from": stamp(at), "queues": {n: {"weight": s.get("weight"), "quotas": s.get("quotas"),
                                                                   "fairSharing": s.get("fairSharing")}
                                                               for n, s in sorted(specs.get(queue_spec.KIND,
                                                                                            {}).items())}}
                               for at, specs in trace.epochs],
            "fairShare": [{"time": stamp(x["at"]), "queues": x["queues"]} for x in sim.samples]}


def _reservations(trace, sim: replay_sim.Replay) -> list[dict]:
    """Per reservation of the window's last configuration: the share of its booked device-seconds inside the
    window that claims running in it used, as recorded (the ledger's ``reservation``) and as replayed (claims
    naming it with ``draservice.io/reservation``)."""
    out = []
    seconds = (trace.end - trace.start).total_seconds()
    for name, spec in sorted(trace.epochs[-1][1].get(reservation_spec.KIND, {}).items()):
        window, _, problems = windows.parse(spec.get("window"))
        if window is None or problems:
            continue
        devices = sum(int(queue_spec.amount_of(r.get("devices") or 0) or 0) for r in spec.get("resources") or [])
        booked = sum(((min(o.end, trace.end) - max(o.start, trace.start)).total_seconds()
                      for o in windows.occurrences(window, trace.start, trace.end)), 0.0) * devices
        used = sum(r.devices * (min(seconds, r.end if r.end is not None else seconds) - max(0.0, r.start))
                   for c in trace.claims for r in c.runs if r.reservation == name)
        used += sum(h.weight * (h.end if h.end is not None else seconds) for h in trace.background
                    if h.reservation == name)
        out.append({"name": name, "bookedDeviceHours": round(booked / 3600, 4),
                    "actual": {"utilisation": round(used / booked, 4) if booked else None},
                    "replayed": {"utilisation": round(sim.reserved_seconds.get(name, 0.0) / booked, 4)
                                 if booked else None}})
    return out


def rendered(replay: Replay) -> dict:
    def stamp(value):
        return value.strftime(ISO) if value else None

    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Replay",
            "metadata": {"name": str(replay.uid), "creationTimestamp": stamp(replay.created_at)},
            "spec": {"window": {"start": stamp(replay.window_start), "end": stamp(replay.window_end)},
                     "configuration": replay.configuration, "budgetSeconds": replay.budget_seconds},
            "status": {"state": replay.state, "message": replay.message or None, "author": replay.author,
                       "startedAt": stamp(replay.started_at), "finishedAt": stamp(replay.finished_at),
                       "results": replay.results}}
