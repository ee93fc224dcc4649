"""Devices in use per allocation round at 40,000 rows: the change log's follower vs reading every row id.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice \
        .venv/bin/python benchmarks/rows_in_use_bench.py [both|before|after|setup]

Uses the database ``<DATABASE_URL's name>_rows_bench`` (created and filled with BENCH_ROWS allocation rows on
first use, or when ``setup`` is given). Then it fills the fleet one claim at a time, as a busy worker does:
each "round" inserts BENCH_CLAIM_ROWS rows in one committed statement (another claim's allocation), then
brings a worker's in-use state up to date and times that:

* before: the previous algorithm (read every row id, diff against what the engine counts, fetch the new
  rows, copy the set);
* after: ``fleet.rows_in_use()`` (the change log since the last round) and the engine cache's update.

Both update a real ``EngineCache`` (over an empty snapshot: the devices are unknown to it, which costs the
same per row); the engine's own search is not part of either. Prints per-round median and p95 time and rows
read, and the trigger's cost per logged row (bulk insert and delete with the triggers on and off).
Targets: rows read per round <= 2x the rows changed, and the round's update <= 1 ms: ``met``/``MISSED``.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._live import bench_database, recreate_database  # noqa: E402

BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
if not BASE_URL.startswith("postgres"):
    sys.exit("rows_in_use_bench needs PostgreSQL: set DATABASE_URL=postgresql://...")
NAME, URL = bench_database(BASE_URL, "rows_bench")
ROWS = int(os.environ.get("BENCH_ROWS", "40000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "200"))
CLAIM_ROWS = int(os.environ.get("BENCH_CLAIM_ROWS", "8"))
TRIGGER_ROWS = int(os.environ.get("BENCH_TRIGGER_ROWS", "5000"))
os.environ.update(DATABASE_URL=URL, DJANGO_SETTINGS_MODULE="draservice.settings", LOG_LEVEL="WARNING")

INSERT = ("INSERT INTO claims_deviceallocation (claim_id, cluster, driver, pool, device, share_id, admin_access, "
          "request, created_at) SELECT %s, 'c1', 'gpu.nvidia.com', 'pool-' || (g / 8), %s || g, '', false, 'gpu', "
          "now() FROM generate_series(%s, %s) g")


def setup() -> None:
    import django
    from django.core.management import call_command

    recreate_database(BASE_URL, NAME)
    django.setup()
    call_command("migrate", verbosity=0)
    from django.db import connection

    from claims.services import claims as claim_services
    from tests.claims import fleet as fleet_helpers

    fleet_helpers.load_device_classes()
    claim = claim_services.create_claims("bench", [fleet_helpers.gpu_claim("holder")])[0]
    with connection.cursor() as cursor:
        cursor.execute(INSERT, [claim.id, "base-", 1, ROWS])
        cursor.execute("ANALYZE")
    from draservice import changes

    while changes.settled() < changes.last_seq():  # the watermark a worker starts from, as beat keeps it
        changes.seal()


def old_read(cache: dict) -> tuple[dict, int]:
    """The algorithm this replaces (claims.services.fleet before the change log), kept here for comparison."""
    from claims.models import DeviceAllocation
    from claims.services import fleet

    ids = set(DeviceAllocation.objects.values_list("id", flat=True))
    for gone in cache.keys() - ids:
        del cache[gone]
    new = ids - cache.keys()
    cache.update(fleet._fetch(new, scan=len(new) > 500))
    return dict(cache), len(ids) + len(new)


def rounds(modes: tuple[str, ...]) -> dict[str, tuple[list[float], list[int]]]:
    """Each round inserts one claim's rows, then brings each mode's in-use state up to date, the modes in
    turn (alternating which goes first), so both are measured under the same load."""
    from django.db import connection

    from claims.models import ResourceClaim
    from claims.services import fleet
    from claims.services.engines import EngineCache
    from dra.engine import FleetSnapshot

    class View:
        key = ("bench",)
        snapshot = FleetSnapshot(clusters=[], device_classes=[])

    claim_id = ResourceClaim.objects.values_list("id", flat=True).first()
    engines = {m: EngineCache() for m in modes}
    cache: dict = {}
    out: dict[str, tuple[list[float], list[int]]] = {m: ([], []) for m in modes}
    tag = f"r{time.time_ns()}-"
    for i in range(-3, ROUNDS):  # three warm-up rounds (the first is a full read in both modes)
        with connection.cursor() as cursor:
            cursor.execute(INSERT, [claim_id, tag, i * CLAIM_ROWS, i * CLAIM_ROWS + CLAIM_ROWS - 1])
        for mode in (modes if i % 2 else modes[::-1]):
            started = time.perf_counter()
            if mode == "before":
                rows, read = old_read(cache)
            else:
                rows = fleet.rows_in_use()
                read = fleet.rows_read_last()
            engines[mode].engine_for(View(), rows)
            if i >= 0:
                out[mode][0].append(time.perf_counter() - started)
                out[mode][1].append(read)
            assert len(engines[mode].rows) == len(rows)  # sanity: the engine counts every row in use
    return out


def report(mode: str, times: list[float], reads: list[int]) -> float:
    median = statistics.median(times) * 1000
    p95 = sorted(times)[int(len(times) * 0.95)] * 1000
    print(f"{mode:6s} rounds={len(times)} in_use~{ROWS} round_update_ms median={median:.3f} p95={p95:.3f} "
          f"rows_read_per_round median={statistics.median(reads):.0f} max={max(reads)}")
    return median


def trigger_cost() -> None:
    """Per logged row: bulk insert then delete of TRIGGER_ROWS rows, triggers on vs off (one statement each)."""
    from django.db import connection, transaction

    from claims.models import ResourceClaim

    claim_id = ResourceClaim.objects.values_list("id", flat=True).first()
    out = {}
    for state in ("DISABLE", "ENABLE", "DISABLE", "ENABLE"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred FK checks pending at ALTER TABLE
            for suffix in ("ins", "del"):
                cursor.execute(f"ALTER TABLE claims_deviceallocation {state} TRIGGER "
                               f"claims_deviceallocation_change_{suffix}")
            started = time.perf_counter()
            cursor.execute(INSERT, [claim_id, f"trig-{time.time_ns()}-", 1, TRIGGER_ROWS])
            inserted = time.perf_counter()
            cursor.execute("DELETE FROM claims_deviceallocation WHERE device LIKE 'trig-%%'")
            deleted = time.perf_counter()
            for suffix in ("ins", "del"):
                cursor.execute(f"ALTER TABLE claims_deviceallocation ENABLE TRIGGER "
                               f"claims_deviceallocation_change_{suffix}")
        out[state] = (inserted - started, deleted - inserted)
    ins = (out["ENABLE"][0] - out["DISABLE"][0]) / TRIGGER_ROWS * 1e6
    dele = (out["ENABLE"][1] - out["DISABLE"][1]) / TRIGGER_ROWS * 1e6
    base_ins, base_del = (out["DISABLE"][0] / TRIGGER_ROWS * 1e6, out["DISABLE"][1] / TRIGGER_ROWS * 1e6)
    print(f"trigger cost per row: insert +{ins:.1f} us (row alone {base_ins:.1f} us), "
          f"delete +{dele:.1f} us (row alone {base_del:.1f} us), {TRIGGER_ROWS} rows per statement")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "both"
    import psycopg

    try:
        with psycopg.connect(URL) as conn:
            conn.execute("SELECT 1 FROM claims_deviceallocation LIMIT 1")
        fresh = mode == "setup"
    except psycopg.Error:
        fresh = True
    if fresh:
        setup()
    import django

    django.setup()
    medians = {}
    reads_after = [0.0]
    modes = ("before", "after") if mode in ("both", "setup") else (mode,)
    for m, (times, reads) in rounds(modes).items():
        medians[m] = report(m, times, reads)
        if m == "after":
            reads_after[0] = statistics.median(reads)
    if "after" in medians:
        print(f"round update <= 1 ms: {'met' if medians['after'] <= 1.0 else 'MISSED'} "
              f"({medians['after']:.3f} ms)")
        print(f"rows read per round <= 2x the {CLAIM_ROWS} rows changed: "
              f"{'met' if reads_after[0] <= 2 * CLAIM_ROWS else 'MISSED'} ({reads_after[0]:.0f})")
    if mode in ("both", "setup"):
        print(f"speed-up before/after: {medians['before'] / medians['after']:.1f}x")
        trigger_cost()
    # Leave the table as found for the next run: only the base rows stay.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM claims_deviceallocation WHERE device NOT LIKE 'base-%%'")


if __name__ == "__main__":
    main()
