"""The soak benchmark's lease phase: do leases end on time when they lapse faster than one sweep's batch?

BENCH_LEASE_RATE (80) leases a second lapse for BENCH_LEASE_SECONDS (90): that many claims with a lease
(``draservice.io/lease-ttl``) are placed first, then their lease ends are set one after the other at that rate
(as if claims with equal leases had been submitted at that rate). Their clusters' agents heartbeat, so each
lapse gets its notice first (``Releasing`` until ``forceAfterSeconds``, 30 s, see claims.services.walltime)
and the release at the notice's deadline: the beat's lease sweep (every 5 s) has two rows a lease to handle,
2 x BENCH_LEASE_RATE a second. Measured per claim from the database: the notice's lag (its ``Releasing``
event after the lease's end) and the release's lag (``released_at`` after the notice's deadline); printed
over the whole phase and per third of it, so a sweep falling behind shows as lags that grow.

Goal: p99 of both lags <= 10 s (the sweep's period, 5 s, plus its own time), the last third's like the first's.
"""
from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

from benchmarks._cost import raise_cap, reset_cap
from benchmarks._live import pct, release_all
from benchmarks._soak import SHAPES, claim
from benchmarks._soak_phases import Heartbeats, post_batches, wait_quiet

RATE = float(os.environ.get("BENCH_LEASE_RATE", "80"))
SECONDS = float(os.environ.get("BENCH_LEASE_SECONDS", "90"))
NS = "lease"
# Seconds from setting the lease ends to the first one: the phase's agents (beating every 10 s, as the soak's own
# thread beats every 30 s, the freshness bound itself) beat once before it, so every lapse gets its notice.
LEAD = 15.0
AGENT_EVERY = 10.0
FORCE_AFTER = 30.0  # claims.services.walltime.DEFAULT_FORCE_AFTER: these claims are in no queue
GOAL_S = 10.0


def lease_phase(port: int, token: str) -> dict:
    from claims.models import ResourceClaim

    n = int(RATE * SECONDS)
    raise_cap(port, token, NS, n)
    bodies = [claim(f"l-{i}", SHAPES[i % len(SHAPES)], None, lease_s=3600) for i in range(n)]
    post_batches(port, token, NS, bodies, threads=2, batch=500)
    wait_quiet(timeout=1800)
    ids = list(ResourceClaim.objects.filter(namespace__name=NS, phase="Allocated").order_by("id")
               .values_list("id", flat=True))
    agents = Heartbeats(every=AGENT_EVERY)
    agents.start()
    try:
        start = datetime.now(UTC) + timedelta(seconds=LEAD)
        lapses = _set_lease_ends(ids, start)
        deadline = time.monotonic() + LEAD + SECONDS + FORCE_AFTER + 600
        while ResourceClaim.objects.filter(id__in=ids, phase="Allocated").exists():
            if time.monotonic() > deadline:
                break
            time.sleep(2)
    finally:
        agents.stop()
    out = _lags(ids, lapses, start)
    release_all(NS)
    wait_quiet()
    reset_cap(port, token, NS)
    return {"claims": len(ids), "rate": RATE, "seconds": SECONDS, **out}


def _set_lease_ends(ids: list[int], start: datetime) -> dict[int, datetime]:
    """Claim i's lease ends at start + i / RATE (one statement)."""
    from django.db import connection

    from claims.models import ResourceClaim

    lapses = {cid: start + timedelta(seconds=i / RATE) for i, cid in enumerate(ids)}
    table = connection.ops.quote_name(ResourceClaim._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET lease_expires_at = v.at FROM unnest(%s::bigint[], %s::timestamptz[]) "
                       f"AS v(id, at) WHERE {table}.id = v.id", [list(lapses), list(lapses.values())])
    return lapses


def _lags(ids: list[int], lapses: dict[int, datetime], start: datetime) -> dict:
    from claims.models import ClaimEvent, ResourceClaim

    noticed = dict(ClaimEvent.objects.filter(claim_id__in=ids, type="Releasing").order_by("id")
                   .values_list("claim_id", "created_at"))
    released = dict(ResourceClaim.objects.filter(id__in=ids).values_list("id", "released_at"))
    rows = []  # (lapse offset s, notice lag s or None, release lag s or None)
    for cid in ids:
        lapse, notice, end = lapses[cid], noticed.get(cid), released.get(cid)
        notice_lag = (notice - lapse).total_seconds() if notice else None
        due = (notice + timedelta(seconds=FORCE_AFTER)) if notice else lapse
        rows.append(((lapse - start).total_seconds(), notice_lag,
                     (end - due).total_seconds() if end else None))
    thirds = []
    for k in range(3):
        lo, hi = k * SECONDS / 3, (k + 1) * SECONDS / 3
        part = [r for r in rows if lo <= r[0] < hi]
        thirds.append(_summary(part))
    return {**_summary(rows), "thirds": thirds}


def _summary(rows) -> dict:
    notice = [r[1] for r in rows if r[1] is not None]
    release = [r[2] for r in rows if r[2] is not None]
    return {"noticed": len(notice), "released": len(release),
            "notice_lag_p50_s": round(pct(notice, 50), 1), "notice_lag_p99_s": round(pct(notice, 99), 1),
            "release_lag_p50_s": round(pct(release, 50), 1), "release_lag_p99_s": round(pct(release, 99), 1)}


def goals(results: dict) -> list[tuple[bool, str]]:
    if "lease" not in results:
        return []
    r = results["lease"]
    ok = (r["noticed"] == r["released"] == r["claims"] and r["notice_lag_p99_s"] <= GOAL_S
          and r["release_lag_p99_s"] <= GOAL_S)
    by_third = ", ".join(f"{t['notice_lag_p99_s']}/{t['release_lag_p99_s']}" for t in r["thirds"])
    return [(ok, f"{r['claims']} leases lapsing at {r['rate']:g}/s: every one noticed and released, p99 lag "
                 f"<= {GOAL_S:g} s (notice {r['notice_lag_p99_s']} s, release {r['release_lag_p99_s']} s; "
                 f"noticed {r['noticed']}, released {r['released']}; p99 notice/release by third: {by_third})")]
