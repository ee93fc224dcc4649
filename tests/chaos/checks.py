"""What a chaos run must not break, checked in the database.

* No device held twice, at any moment: the unique indexes on allocation rows exist and hold now, and no two
  intervals of the usage ledger (one row per device a claim held, opened in the commit's transaction and
  closed in the release's) overlap on one dedicated device.
* No queue over ``nominal + borrowingLimit``: at each moment a queue's interval opened (each commit that gave
  it devices), the ledger's intervals of that queue open then are counted; and during the run, sampled.
* No device handed to a preemptor early: each device a victim held when noticed goes to its preemptor only at
  or after the victim's confirmation (or release) or its ``forceAt`` (``early_handovers``).
* No claim lost: every claim the run created exists and is Allocated (with exactly its rows, charges and open
  intervals), Pending with the reason of a decision, or Released by the run; none Failed; every preemption
  finished, and each victim was requeued (its event) or had been released.

The counts (preemptions marked, requeued, reclaim or within a queue) come from the database too.
"""
from __future__ import annotations

from collections import defaultdict

from django.db import connection
from django.db.models import Count, Sum

from claims.models import ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from queues.models import Preemption, PreemptionState, QuotaCharge
from tests.usage.conftest import assert_ledger_matches_allocations
from usage.models import UsageInterval

LEDGER = UsageInterval._meta.db_table
ALLOCATIONS = DeviceAllocation._meta.db_table
UNIQUE_INDEXES = ("claims_alloc_dedicated_unique", "claims_alloc_share_unique")
# Pending after settling: a decision was made at the current fleet (no room, no quota, a node kept for a head).
DECIDED = ("Unsatisfiable", "WaitingForQuota", "HeldForQueueHead", "LostRace")


def held_by_queue() -> dict[int, int]:
    """Devices charged to each queue (by id) by its Allocated claims, now."""
    rows = (QuotaCharge.objects.filter(claim__phase=Phase.ALLOCATED, unit="devices").values("queue_id")
            .annotate(n=Sum("amount")).values_list("queue_id", "n"))
    return {qid: int(n) for qid, n in rows}


def doubles_now() -> list:
    with connection.cursor() as cur:
        cur.execute(f"""SELECT cluster, driver, pool, device FROM {ALLOCATIONS} WHERE NOT admin_access
                        GROUP BY 1, 2, 3, 4 HAVING count(*) FILTER (WHERE share_id = '') > 1
                        OR (count(*) FILTER (WHERE share_id = '') > 0 AND count(*) > 1)""")
        return cur.fetchall()


def unique_indexes() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE 'CREATE UNIQUE%%'",
                    [ALLOCATIONS])
        return {row[0] for row in cur.fetchall()}


def doubles_in_history() -> list:
    """Pairs of ledger intervals that held one dedicated device at the same time."""
    with connection.cursor() as cur:
        cur.execute(f"""SELECT a.claim_name, b.claim_name, a.cluster, a.device, a.started_at, a.ended_at,
                               b.started_at, b.ended_at
                        FROM {LEDGER} a JOIN {LEDGER} b ON a.cluster = b.cluster AND a.driver = b.driver
                             AND a.pool = b.pool AND a.device = b.device AND a.id < b.id
                        WHERE a.share_id = '' AND b.share_id = ''
                          AND a.started_at < COALESCE(b.ended_at, 'infinity')
                          AND b.started_at < COALESCE(a.ended_at, 'infinity')""")
        return cur.fetchall()


def early_handovers() -> list:
    """Devices a preemptor's ledger interval took from its victim (the victim held it when noticed) before the
    earlier of the victim's confirmation and its forceAt (the Preemption's deadline). A cancelled notice is left
    out: its victim kept its devices, and a later move of them to the same preemptor answers to the later notice
    (or the victim's own release)."""
    with connection.cursor() as cur:
        cur.execute(f"""SELECT p.id, v.claim_name, w.claim_name, v.device, w.started_at, p.confirmed_at, p.deadline
                        FROM {Preemption._meta.db_table} p
                        JOIN {LEDGER} v ON v.claim_id = p.victim_id AND v.started_at <= p.created_at
                             AND COALESCE(v.ended_at, 'infinity') >= p.created_at
                        JOIN {LEDGER} w ON w.claim_id = p.preemptor_id AND w.cluster = v.cluster
                             AND w.driver = v.driver AND w.pool = v.pool AND w.device = v.device
                             AND w.started_at >= p.created_at
                        WHERE p.state <> %s
                          AND w.started_at < LEAST(COALESCE(p.confirmed_at, 'infinity'), p.deadline)""",
                    [PreemptionState.CANCELLED])
        return cur.fetchall()


def peaks_in_history(queues: list[str]) -> dict[str, int]:
    """Per queue, the most devices its ledger intervals held at any moment one of them opened."""
    with connection.cursor() as cur:
        cur.execute(f"""SELECT a.queue, max(a.held) FROM (
                          SELECT s.queue, s.started_at, count(*) AS held
                          FROM (SELECT DISTINCT queue, started_at FROM {LEDGER} WHERE queue = ANY(%s)) s
                          JOIN {LEDGER} b ON b.queue = s.queue AND b.share_id = '' AND b.started_at <= s.started_at
                               AND COALESCE(b.ended_at, 'infinity') > s.started_at
                          GROUP BY 1, 2) a GROUP BY 1""", [queues])
        return dict(cur.fetchall())


def preemption_counts(queue_of_namespace: dict[str, str]) -> dict[str, int]:
    rows = list(Preemption.objects.values_list("state", "queue", "preemptor__namespace__name"))
    return {
        "marked": ClaimEvent.objects.filter(reason="PreemptionPending").count(),
        "requeued": ClaimEvent.objects.filter(type="Preempted", reason="Preempted").count(),
        # Notices withdrawn before the devices moved (the preemptor was allocated elsewhere, or gone).
        "cancelled": ClaimEvent.objects.filter(type="Preempted", reason="PreemptionCancelled").count(),
        "reclaim": sum(1 for _, q, ns in rows if queue_of_namespace.get(ns) != q),
        "within_queue": sum(1 for _, q, ns in rows if queue_of_namespace.get(ns) == q),
        "pending": sum(1 for s, _, _ in rows if s == PreemptionState.PENDING),
    }


def extra_victims() -> int:
    """Victims beyond one per preemptor (every claim of the chaos runs asks for 1 device, so one victim frees
    what it needs): what overlapping preemption passes take too many (a known bug, see
    tests/queues/test_preemption.py::test_overlapping_passes_give_a_claim_its_victims_once)."""
    per = (Preemption.objects.exclude(state=PreemptionState.CANCELLED).values("preemptor_id")
           .annotate(n=Count("id")).filter(n__gt=1))
    return sum(row["n"] - 1 for row in per)


def assert_nothing_lost(created: set[tuple[str, str]], released: set[tuple[str, str]]) -> dict[str, int]:
    """Every claim accounted for (see the module's docstring); returns the phases counted."""
    claims = {(c.namespace.name, c.name): c for c in ResourceClaim.objects.select_related("namespace")}
    assert set(claims) == created, (f"missing: {sorted(created - set(claims))[:10]}, "
                                    f"unexpected: {sorted(set(claims) - created)[:10]}")
    rows = defaultdict(set)
    for claim_id, cluster, driver, pool, device in DeviceAllocation.objects.values_list(
            "claim_id", "cluster", "driver", "pool", "device"):
        rows[claim_id].add((cluster, driver, pool, device))
    charged = dict(QuotaCharge.objects.filter(unit="devices", claim__phase=Phase.ALLOCATED).values("claim_id")
                   .annotate(n=Sum("amount")).values_list("claim_id", "n"))
    phases: dict[str, int] = defaultdict(int)
    for key, claim in claims.items():
        phases[claim.phase] += 1
        if claim.phase == Phase.ALLOCATED:
            results = claim.allocation["devices"]["results"]
            want = {(claim.cluster, r["driver"], r["pool"], r["device"]) for r in results}
            assert rows.get(claim.id) == want, (key, "rows differ from its allocation")
            assert int(charged.get(claim.id, 0)) == len(want), (key, "charged", charged.get(claim.id))
        else:
            assert claim.id not in rows, (key, claim.phase, "holds devices")
        if claim.phase == Phase.PENDING:
            assert claim.reason in DECIDED and claim.attempts >= 1, (key, claim.reason, claim.message)
        assert claim.phase != Phase.FAILED, (key, claim.reason, claim.message)
        assert (claim.phase == Phase.RELEASED) == (key in released), (key, claim.phase)
    assert_ledger_matches_allocations()

    # Every preemption finished: its victim was requeued (the event), or released before its deadline -- or the
    # notice was cancelled (its preemptor no longer needed the devices) and the victim was not requeued for it.
    requeues = defaultdict(list)
    for claim_id, at in ClaimEvent.objects.filter(type="Preempted", reason="Preempted").values_list(
            "claim_id", "created_at"):
        requeues[claim_id].append(at)
    cancels = defaultdict(list)
    for claim_id, at in ClaimEvent.objects.filter(type="Preempted", reason="PreemptionCancelled").values_list(
            "claim_id", "created_at"):
        cancels[claim_id].append(at)
    for p in Preemption.objects.select_related("victim__namespace"):
        assert p.state in (PreemptionState.DONE, PreemptionState.CANCELLED), (p.victim.name, p.state, p.deadline)
        if p.state == PreemptionState.CANCELLED:
            assert any(at >= p.created_at for at in cancels[p.victim_id]), (p.victim.name, "cancel event")
            assert not any(p.created_at <= at <= p.finished_at for at in requeues[p.victim_id]), p.victim.name
            continue
        requeued = any(at >= p.created_at for at in requeues[p.victim_id])
        assert requeued or p.victim.phase == Phase.RELEASED, (p.victim.namespace.name, p.victim.name)
    # A requeue event per preemption at most (none was requeued twice for one notice).
    per_victim = Preemption.objects.exclude(state=PreemptionState.CANCELLED).values("victim_id").annotate(
        n=Count("id"))
    for row in per_victim:
        assert len(requeues[row["victim_id"]]) <= row["n"], row
    return dict(phases)
