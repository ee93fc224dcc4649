"""The worker's devices in use, kept current from the change log (``fleet.rows_in_use``).

Writers here are separate PostgreSQL sessions with real transactions, opened, written and committed (or
rolled back) in any interleaving, so seqs are committed out of order; after every step the incrementally
kept rows must equal a read of the table from scratch.
"""
from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from claims.models import DeviceAllocation, ResourceClaim
from claims.services import claims as claim_services
from claims.services import fleet
from claims.services.engines import engines
from dra.engine import Engine
from draservice import changes
from draservice.models import Change
from scheduler.services import allocation
from tests.claims import fleet as fleet_helpers

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: a change settles once its writer ends
NS = "team-a"
WRITERS = 3


def _dsn() -> str:
    db = settings.DATABASES["default"]
    return f"host={db['HOST']} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"


def fresh() -> dict[int, object]:
    return fleet._fetch(set(DeviceAllocation.objects.values_list("id", flat=True)))


@pytest.fixture
def claim_id(db):
    fleet_helpers.load_device_classes()
    claim = claim_services.create_claims(NS, [fleet_helpers.gpu_claim("holder")])[0]
    # The claim's own allocation round may have run already at commit: start from no rows at all.
    DeviceAllocation.objects.all().delete()
    return claim.id


class Writers:
    """WRITERS sessions, each with at most one open transaction; knows which committed rows are free to
    delete (not deleted already, nor row-locked by another open transaction's delete)."""

    def __init__(self, claim: int):
        self.claim = claim
        self.conns = [psycopg.connect(_dsn()) for _ in range(WRITERS)]
        self.mine: list[set[int]] = [set() for _ in range(WRITERS)]  # rows this open transaction inserted
        self.deleting: list[set[int]] = [set() for _ in range(WRITERS)]  # committed rows it deleted
        self.devices = 0

    def committed(self) -> set[int]:
        return set(DeviceAllocation.objects.values_list("id", flat=True))

    def step(self, w: int, op: str, pick: int) -> None:
        conn = self.conns[w]
        if op == "insert":
            self.devices += 1
            n = 1 + pick % 3  # one statement of one to three rows
            rows = conn.execute(
                "INSERT INTO claims_deviceallocation (claim_id, cluster, driver, pool, device, share_id, "
                "admin_access, request, created_at) SELECT %s, 'c1', 'gpu.nvidia.com', 'pool', "
                "'gpu-' || %s || '-' || g, '', false, 'gpu', now() FROM generate_series(1, %s) g RETURNING id",
                (self.claim, self.devices, n)).fetchall()
            self.mine[w] |= {r[0] for r in rows}
        elif op == "delete":
            busy = set().union(*self.deleting)
            free = sorted((self.committed() - busy) | self.mine[w])
            if free:
                victim = free[pick % len(free)]
                conn.execute("DELETE FROM claims_deviceallocation WHERE id = %s", (victim,))
                if victim in self.mine[w]:
                    self.mine[w].discard(victim)
                else:
                    self.deleting[w].add(victim)
        else:
            conn.commit() if op == "commit" else conn.rollback()
            self.mine[w], self.deleting[w] = set(), set()

    def close(self) -> None:
        for conn in self.conns:
            conn.rollback()
            conn.close()


STEPS = st.lists(st.tuples(st.integers(0, WRITERS - 1), st.sampled_from(["insert", "insert", "delete", "commit",
                                                                          "rollback"]),
                           st.integers(0, 1000)), min_size=5, max_size=40)


@hsettings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
# Found by this test: writer 2's transaction id equalled the snapshot's xmax (one past the latest completed
# id), so a horizon taken from xmax alone declared its seq rolled back while it was still running.
@example(steps=[(0, "insert", 0), (0, "insert", 0), (0, "insert", 0), (2, "insert", 0), (0, "insert", 0)])
def test_incremental_rows_equal_a_fresh_read_after_every_step(claim_id, steps):
    cache = fleet._RowCache()
    cache.read()
    writers = Writers(claim_id)
    try:
        for w, op, pick in steps + [(w, "commit", 0) for w in range(WRITERS)]:
            writers.step(w, op, pick)
            assert cache.read() == fresh()
        assert cache.follower is not None
        for _ in range(3):  # every writer has ended: the follower's position reaches the last change
            cache.read()
        last = Change.objects.order_by("-seq").values_list("seq", flat=True).first()
        assert not cache.follower.seen and cache.follower.seq == last
    finally:
        writers.close()
        DeviceAllocation.objects.all().delete()


def test_a_row_committed_below_a_later_one_is_not_missed_and_the_table_is_not_reread(claim_id):
    cache = fleet._RowCache()
    cache.read()
    writers = Writers(claim_id)
    try:
        writers.step(0, "insert", 0)  # the lower seqs, in flight
        writers.step(1, "insert", 0)
        writers.step(1, "commit", 0)
        assert set(cache.read()) == writers.committed() and len(cache.read()) == 1
        writers.step(0, "commit", 0)
        got = cache.read()
        assert set(got) == writers.committed() and len(got) == 2 and got == fresh()
        cache.read()
        assert cache.rows_read == 0  # nothing new since: a read costs the changes, not the table
        writers.step(2, "delete", 0)
        writers.step(2, "commit", 0)
        assert cache.read() == fresh() and cache.rows_read == 1  # one log entry, no row fetched
    finally:
        writers.close()


def test_compacted_past_the_follower_falls_back_to_one_full_read(claim_id):
    """Allocation entries are kept a shorter while than the watches' changes: compacted past a follower,
    it reads the table afresh; a watch passes over the compacted seqs without waiting on them as gaps."""
    cache = fleet._RowCache()
    writers = Writers(claim_id)
    try:
        writers.step(0, "insert", 2)
        writers.step(0, "commit", 0)
        assert cache.read() == fresh()
        behind = cache.follower.seq
        watch = changes.Cursor(behind)
        writers.step(0, "delete", 0)
        writers.step(0, "insert", 1)
        writers.step(0, "commit", 0)
        claim_services.create_claims(NS, [fleet_helpers.gpu_claim("later")])
        changes.seal()
        changes.seal()
        Change.objects.update(at=Change.objects.order_by("seq").first().at - timedelta(hours=2))
        removed = changes.compact(timedelta(hours=3), rows_retention=timedelta(hours=1))
        assert removed >= 3 and not Change.objects.filter(resource=fleet.ALLOCATIONS).exists()
        changes.check_not_expired(behind)  # the watches' window is untouched
        with pytest.raises(changes.Expired):
            changes.Follower(fleet.ALLOCATIONS, behind).read()
        assert cache.read() == fresh() and len(fresh()) == 4
        assert cache.follower.seq > behind
        got = watch.read({"resourceclaims"})  # at once: the compacted seqs are not gaps to wait on
        assert "later" in {c.name for c in got}
    finally:
        writers.close()


def _in_use(engine: Engine) -> tuple:
    return (bytes(engine.excl), {k: v for k, v in engine.active.items() if v},
            {k: v for k, v in engine.node_used.items() if v})


def test_the_rounds_own_writes_are_counted_once(admin_client, small_fleet):
    engines.reset()
    claim_services.create_claims(NS, [fleet_helpers.gpu_claim(f"c{i}", count=2) for i in range(3)])
    while allocation.allocate_round().taken:
        pass
    assert DeviceAllocation.objects.count() == 6
    view = fleet.current_view()
    rows = fleet.rows_in_use()
    back = rows.touched(engines.synced[1])
    assert back and back <= engines.rows.keys()  # the round's own rows, back from the log, counted already
    engine = engines.engine_for(view, rows)
    assert _in_use(engine) == _in_use(Engine(view.snapshot, list(fresh().values())))
    # Another writer's release, then the next read: only that change is applied, once.
    claim_services.release_claim(ResourceClaim.objects.get(name="c0").id)
    rows = fleet.rows_in_use()
    assert len(rows.touched(engines.synced[1]) or ()) == 2
    engine = engines.engine_for(view, rows)
    assert _in_use(engine) == _in_use(Engine(view.snapshot, list(fresh().values())))
    assert sum(engine.excl) == 4


def test_sqlite_follows_the_log_too(tmp_path):
    """SQLite (the embedded default): one writer at a time; the same follower over the SQLite triggers."""
    import subprocess
    import sys

    db = tmp_path / "db.sqlite3"
    env = {"DATABASE_URL": f"sqlite:///{db}", "PATH": "/usr/bin:/bin"}
    script = (
        "import django; django.setup()\n"
        "from django.core.management import call_command; call_command('migrate', verbosity=0)\n"
        "from claims.models import DeviceAllocation; from claims.services import fleet\n"
        "from claims.services import claims as cs; from tests.claims import fleet as fh\n"
        "fh.load_device_classes(); claim = cs.create_claims('team-a', [fh.gpu_claim('x')])[0]\n"
        "DeviceAllocation.objects.all().delete(); cache = fleet._RowCache(); cache.read()\n"
        "for i in range(5): DeviceAllocation.objects.create(claim=claim, cluster='c', driver='d', pool='p', "
        "device=f'g{i}')\n"
        "DeviceAllocation.objects.filter(device__in=['g1', 'g3']).delete()\n"
        "got = cache.read(); want = fleet._fetch(set(DeviceAllocation.objects.values_list('id', flat=True)))\n"
        "assert got == want and len(got) == 3 and cache.rows_read == 7, (got, want, cache.rows_read)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], env={**env, "DJANGO_SETTINGS_MODULE":
                         "draservice.settings"}, cwd=str(settings.BASE_DIR), capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_random_interleavings_seeded(claim_id):
    """The same property as the hypothesis test over longer traces, seeded (reproducible)."""
    rng = random.Random(14)
    cache = fleet._RowCache()
    cache.read()
    writers = Writers(claim_id)
    try:
        for _ in range(150):
            writers.step(rng.randrange(WRITERS), rng.choice(["insert", "insert", "delete", "commit", "rollback"]),
                         rng.randrange(1000))
            assert cache.read() == fresh()
    finally:
        writers.close()
    connection.close()


def test_rounds_log_the_rows_they_read_and_their_time_in_locks(admin_client, small_fleet):
    """The soak benchmark's per-round figures come from the rounds' own log (the worker task records every
    round): a round after a few changes reads those changes, not the table, and a round that commits spends
    time in lock-taking statements."""
    from claims.models import AllocationRound

    engines.reset()
    claim_services.create_claims(NS, [fleet_helpers.gpu_claim(f"c{i}") for i in range(4)])  # runs a round
    first = AllocationRound.objects.order_by("id").last()
    assert first is not None and first.allocated == 4 and first.lock_seconds > 0
    assert DeviceAllocation.objects.count() == 4
    claim_services.create_claims(NS, [fleet_helpers.gpu_claim("c4")])  # reads the first round's 4 rows back
    claim_services.release_claim(ResourceClaim.objects.get(name="c0").id)
    claim_services.create_claims(NS, [fleet_helpers.gpu_claim("late")])
    later = AllocationRound.objects.order_by("id").last()
    assert later.allocated == 1 and DeviceAllocation.objects.count() == 5
    # What changed since the previous round: c4's row added, c0's deleted. A read of the table would be the 4
    # rows held then.
    assert later.rows_read == 2, later.rows_read
