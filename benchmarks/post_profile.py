"""Where one POST of a claim and one claims round spend their time: queries (count, database time) and CPU.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice \
    BENCH_BROKER_URL=redis://127.0.0.1:6379/14 .venv/bin/python benchmarks/post_profile.py

Runs against the database ``claims_e2e_bench.py`` left behind (``<DATABASE_URL's name>_claims_bench``, its
fleet; without it, says so and does nothing), in this one process, so the
figures do not depend on how busy the machine is as much as throughput does: the web side (``POSTS`` claims
through the Django test client, rounds NOT run: the broker gets the kick), the worker side (rounds
of up to ``ROUND`` claims, inline), and, for single POSTs, the web side of the rest of those claims' lives: a
GET of each (allocated) and its release (``POST …/release``). Each prints its queries per claim grouped
by statement, with their database time, and its CPU per claim; ``PROFILE=1`` adds cProfile's top functions.

Knobs: PROFILE_DATABASE_URL (another benchmark's database left behind, e.g. soak_bench.py's
``<name>_soak_bench``, used as it is), POSTS (300), BATCH (claims per POST of the batch endpoint; 0: single
POSTs), ROUND (500), QUEUED (pending claims left in the queue before measuring: 0), PROFILE (cProfile on CPU
time), PROFILE_SORT (cumulative), PROFILE_LINES (35), COUNT (0: no statement counting, whose own CPU is then
left out).
"""
from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
if os.environ.get("PROFILE_DATABASE_URL"):  # another benchmark's database (soak_bench.py's ``..._soak_bench``)
    os.environ["DATABASE_URL"] = os.environ["PROFILE_DATABASE_URL"]
elif not BASE_URL.endswith("_claims_bench"):  # the e2e benchmark's database, never the one given
    os.environ["DATABASE_URL"] = BASE_URL + "_claims_bench"
os.environ["CELERY_BROKER_URL"] = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("LOG_LEVEL", "WARNING")

POSTS = int(os.environ.get("POSTS", "300"))
ROUND = int(os.environ.get("ROUND", "500"))
QUEUED = int(os.environ.get("QUEUED", "0"))
BATCH = int(os.environ.get("BATCH", "0"))
PROFILE = os.environ.get("PROFILE") == "1"
COUNT = os.environ.get("COUNT", "1") != "0"


class Queries:
    """Every statement's normalized text -> [count, seconds]."""

    def __init__(self) -> None:
        self.stats: dict[str, list] = defaultdict(lambda: [0, 0.0])

    def __call__(self, execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            key = re.sub(r"\s+", " ", re.sub(r"%s(, %s)*|\$\d+|'[^']*'|\b\d+\b", "?", str(sql)))[:150]
            entry = self.stats[key]
            entry[0] += 1
            entry[1] += time.perf_counter() - t

    def report(self, per: int, title: str) -> None:
        total_n = sum(n for n, _ in self.stats.values())
        total_s = sum(s for _, s in self.stats.values())
        print(f"\n== {title}: {total_n / per:.2f} queries and {total_s / per * 1000:.2f} ms of database per claim")
        for key, (n, s) in sorted(self.stats.items(), key=lambda kv: -kv[1][1])[:20]:
            print(f"  {n / per:7.3f}/claim {s / per * 1000:7.3f} ms/claim  {key}")


def claim(name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


# Every module that runs statements on psycopg directly (``draservice.bulk.pg_execute``, imported by name).
RAW_USERS = ("claims.services.insert", "claims.services.bulk")


def _count_raw(queries: Queries) -> None:
    """Statements run on psycopg directly pass no Django wrapper: count them (``_uncount_raw`` undoes it)."""
    import importlib

    from draservice import bulk

    original = bulk.pg_execute

    def timed(sql, params):
        return queries(lambda *a: original(sql, params), sql, params, False, None)

    for name in RAW_USERS:
        importlib.import_module(name).pg_execute = timed


def _uncount_raw() -> None:
    import importlib

    from draservice import bulk

    for name in RAW_USERS:
        importlib.import_module(name).pg_execute = bulk.pg_execute


def measure(title: str, per: int, fn) -> None:
    from django.db import connection

    queries = Queries()
    if COUNT:
        _count_raw(queries)
    profiler = cProfile.Profile(time.process_time) if PROFILE else None  # CPU: a busy machine inflates wall time
    t0, c0 = time.perf_counter(), time.process_time()
    with connection.execute_wrapper(queries) if COUNT else contextlib.nullcontext():
        if profiler:
            profiler.enable()
        fn()
        if profiler:
            profiler.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if COUNT:
        _uncount_raw()
        queries.report(per, title)
    else:
        print(f"\n== {title}")
    print(f"  wall {wall / per * 1000:.2f} ms/claim, CPU of this process {cpu / per * 1000:.2f} ms/claim")
    if profiler:
        stats = pstats.Stats(profiler).sort_stats(os.environ.get("PROFILE_SORT", "cumulative"))
        stats.print_stats(int(os.environ.get("PROFILE_LINES", "35")))


def main() -> None:
    import django

    if not os.environ["DATABASE_URL"].startswith("postgres"):
        print("post_profile: needs PostgreSQL (the database claims_e2e_bench.py leaves); skipped")
        return
    django.setup()
    from django.db import connection
    from django.db.utils import OperationalError

    try:
        connection.ensure_connection()
    except OperationalError:
        print(f"post_profile: no database {os.environ['DATABASE_URL'].rsplit('/', 1)[-1]}: run "
              "benchmarks/claims_e2e_bench.py first; skipped")
        return
    import json

    from django.db import transaction
    from django.test import Client
    from django.utils import timezone

    from claims.models import ResourceClaim
    from claims.services.claims import _release_locked
    from draservice.models import APIToken
    from draservice.tokens import issue_token
    from inventory.models import Cluster
    from scheduler.services import allocation

    with transaction.atomic():  # every device free (the benchmark's database: nobody else's claims)
        _release_locked(list(ResourceClaim.objects.select_for_update().select_related("namespace")
                             .filter(phase__in=["Pending", "Allocated"])), "Released", "profile", timezone.now())
    # The fleet was pushed when the benchmark ran: heartbeat now, or it is stale and nothing is placed.
    Cluster.objects.update(last_heartbeat_at=timezone.now(), stale_since=None)
    _, secret = issue_token(kind=APIToken.ADMIN, name="post profile")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    tag = f"p{int(time.time())}"
    url = f"/api/v1/namespaces/{tag}/resourceclaims"

    def post(name: str) -> None:
        resp = client.post(url, json.dumps(claim(name)), content_type="application/json")
        assert resp.status_code == 201, resp.content

    # Room for every claim it leaves pending (no worker runs here), given as an admin gives it.
    resp = client.patch(f"/api/v1/namespaces/{tag}/objectquota", json.dumps(
        {"spec": {"hard": {"pending-claims": max(5000, POSTS + QUEUED + 1)}}}), content_type="application/json")
    assert resp.status_code == 200, resp.content
    post("warm-0")
    for i in range(QUEUED):  # a queue of pending claims (never allocated: no worker runs here)
        post(f"q-{i}")
    def post_batches() -> None:
        for start in range(0, POSTS, BATCH):
            items = [claim(f"b-{i}") for i in range(start, min(POSTS, start + BATCH))]
            resp = client.post(f"{url}/batch", json.dumps({"items": items}), content_type="application/json")
            assert resp.status_code == 201, resp.content

    if BATCH:
        measure(f"web: {POSTS} claims in batch POSTs of {BATCH} ({QUEUED} queued before)", POSTS, post_batches)
    else:
        measure(f"web: {POSTS} single POSTs ({QUEUED} queued before)", POSTS,
                lambda: [post(f"s-{i}") for i in range(POSTS)])

    def rounds() -> None:
        while allocation.allocate_round(ROUND).taken:
            pass

    allocation.allocate_round(1)  # the engine and the fleet snapshot, built once per process
    measure(f"worker: rounds of {ROUND}", POSTS + QUEUED, rounds)
    if not BATCH:  # the rest of a placed claim's web work: its holder reads it, then releases it
        def call(method: str, name: str, suffix: str = "") -> None:
            resp = getattr(client, method)(f"{url}/{name}{suffix}")
            assert resp.status_code == 200, resp.content

        measure(f"web: {POSTS} GETs of allocated claims", POSTS, lambda: [call("get", f"s-{i}") for i in range(POSTS)])
        measure(f"web: {POSTS} releases (POST …/release)", POSTS,
                lambda: [call("post", f"s-{i}", "/release") for i in range(POSTS)])
    with transaction.atomic():
        mine = list(ResourceClaim.objects.select_for_update().select_related("namespace")
                    .filter(namespace__name=tag))
        _release_locked(mine, "Released", "profile done", timezone.now())


if __name__ == "__main__":
    main()
