"""The soak benchmark's database reads and its two separate phases (one release with thousands pending; draining
pre-submitted claims with one and two worker processes). Django is set up by soak_bench.py before any call."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks._live import Client, pct, release_all
from benchmarks._soak import CLAIMS, SHAPES, TEAMS, Trace, claim, cpu_seconds, process_tree

SLOTS_TOTAL = [1]  # the fleet's 1-device slots, set once the fleet is loaded (for fullness %)


class Heartbeats(threading.Thread):
    """What each cluster's agent does between pushes: a heartbeat every ``every`` seconds. Without it the
    clusters go stale after STALE_CLUSTER_SECONDS (5 minutes) and their devices are no longer offered."""

    def __init__(self, every: float = 30.0):
        super().__init__(daemon=True)
        self.every, self.halt = every, threading.Event()

    def run(self) -> None:
        from django.db import connection

        from inventory.models import Cluster
        from inventory.services.clusters import record_heartbeat

        while not self.halt.wait(self.every):
            for cluster in Cluster.objects.all():
                record_heartbeat(cluster, agent_version="soak-bench")
        connection.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def post_batches(port: int, token: str, ns: str, bodies: list[dict], threads: int = 4, batch: int = 100) -> None:
    """POST ``bodies`` through the batch endpoint; ``threads=1`` keeps their order (ids follow submission)."""
    local: dict = {}

    def send(items: list[dict]) -> None:
        client = local.setdefault(threading.get_ident(), Client(port, token))
        status, body = client.call("POST", CLAIMS.format(ns=ns) + "/batch", {"items": items})
        if status != 201:
            raise SystemExit(f"batch POST to {ns}: {status} {str(body)[:300]}")

    chunks = [bodies[i:i + batch] for i in range(0, len(bodies), batch)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for f in [pool.submit(send, c) for c in chunks]:
            f.result()


def undecided() -> int:
    """Pending claims no round has tried since the fleet last changed (taken ones included, unlike the
    service's ``eligible_pending``: a claim a round is deciding right now is not decided yet)."""
    from scheduler.services import allocation

    return allocation.undecided_pending().count()


def wait_quiet(timeout: float = 600) -> None:
    """Until every pending claim has been tried at the current fleet version (three reads in a row)."""
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 3:
        quiet = quiet + 1 if undecided() == 0 else 0
        if time.monotonic() > deadline:
            raise SystemExit(f"claims still undecided after {timeout:.0f} s")
        time.sleep(0.2)


def warm_up(port: int, token: str) -> None:
    """One claim per shape: the worker builds its fleet snapshot and engine (once per process) before the soak."""
    post_batches(port, token, "warmup", [claim(f"w-{s.name}", s, None) for s in SHAPES])
    wait_quiet(timeout=300)
    release_all("warmup")


def release_everything() -> None:
    release_all()
    wait_quiet()


def trace_rows() -> list[tuple[float, float | None, float | None]]:
    """(created, allocated or None, released or None) in unix seconds of every trace claim."""
    from claims.models import ResourceClaim

    rows = ResourceClaim.objects.filter(namespace__name__in=[f"team-{i}" for i in range(TEAMS)])
    return [(c.timestamp(), a.timestamp() if a else None, r.timestamp() if r else None)
            for c, a, r in rows.values_list("created_at", "allocated_at", "released_at")]


def latencies(claims, lo: float, hi: float, now: float) -> tuple[list[float], int]:
    """Submit->allocated in ms of the claims submitted in [lo, hi), and how many were never placed. A claim
    never placed counts with what it waited (until released, or until now): a lower bound, so that a backlog
    raises the percentiles instead of vanishing from them."""
    lat, unplaced = [], 0
    for c, a, r in claims:
        if lo <= c < hi:
            if a is None:
                unplaced += 1
            lat.append(((a if a is not None else r if r is not None else now) - c) * 1000)
    return lat, unplaced


def round_rows(since: float) -> list[tuple[float, float, int, int, float, int]]:
    """(finished, seconds, taken, rows read, lock seconds, lost races) of the allocation rounds logged since
    ``since`` (unix seconds): the service's own per-round figures (``claims.AllocationRound``)."""
    from datetime import UTC, datetime

    from claims.models import AllocationRound

    rows = AllocationRound.objects.filter(finished_at__gte=datetime.fromtimestamp(since, UTC))
    return [(f.timestamp(), *rest) for f, *rest in rows.values_list(
        "finished_at", "seconds", "taken", "rows_read", "lock_seconds", "lost_race")]


def round_costs(rounds) -> dict:
    """Rows read per round (mean, max) and the share of round time spent in lock-taking statements."""
    busy = sum(r[1] for r in rounds)
    return {"rows_read_per_round": round(sum(r[3] for r in rounds) / len(rounds)) if rounds else None,
            "rows_read_max": max((r[3] for r in rounds), default=None),
            "lock_wait_pct": round(100 * sum(r[4] for r in rounds) / busy, 1) if busy else None,
            "lost_races": sum(r[5] for r in rounds)}


def window_stats(claims, lo: float, hi: float) -> dict:
    """Claims submitted in [lo, hi): latency submit->allocated; placements in [lo, hi) per second."""
    lat, unplaced = latencies(claims, lo, hi, time.time())
    placed = sum(1 for _, a, _ in claims if a is not None and lo <= a < hi)
    return {"submitted": len(lat), "never_placed": unplaced, "placed_per_s": round(placed / (hi - lo), 1),
            "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1),
            "max_ms": round(max(lat, default=float("nan")), 1)}


def release_phase(port: int, token: str, h100_nodes: int, l4_nodes: int, pending: int, worker_pid: int) -> dict:
    """The H100 and L4 clusters full; ``pending - 1`` 2-GPU H100 claims (distinct selector texts, so no two
    share a decision) and, last, one 1-GPU L4 claim wait. One L4 GPU is released: only the last claim can use
    it. (The hole is in another cluster than the 2-GPU claims' on purpose: their queue's head holds the node
    with the most free devices of its cluster, so a GPU freed there is kept for it, as it should be.) Worker
    CPU = utime + stime of the worker's processes (``/proc``) from the release until the claim was seen placed
    (polled every 5 ms), which load does not inflate; the rounds' wall time (``AllocationRound.seconds``) is
    printed beside it."""
    from datetime import UTC, datetime

    from django.utils import timezone

    from claims.models import AllocationRound, ResourceClaim

    h100, l4 = SHAPES[0], SHAPES[2]
    gpus = h100_nodes * h100.slots_per_node + l4_nodes * l4.slots_per_node
    post_batches(port, token, "fill", [claim(f"f-{i}", h100, None) for i in range(h100_nodes * h100.slots_per_node)]
                 + [claim(f"g-{i}", l4, None) for i in range(l4_nodes * l4.slots_per_node)])
    wait_quiet(timeout=900)
    full = ResourceClaim.objects.filter(namespace__name="fill", phase="Allocated").count()
    bodies = [claim(f"b-{i}", h100, 20_000 + i, count=2) for i in range(pending - 1)]
    bodies.append(claim("fit", l4, 20_000 + pending, count=1))
    t = time.monotonic()
    post_batches(port, token, "pending", bodies, threads=1)
    wait_quiet(timeout=1800)
    first_pass_s = time.monotonic() - t
    waiting = ResourceClaim.objects.filter(namespace__name="pending", phase="Pending").count()
    # BENCH_RELEASE_HOLD: seconds to wait before the release (to attach a profiler to the quiet worker).
    time.sleep(float(os.environ.get("BENCH_RELEASE_HOLD", "1")))
    released_at = timezone.now()
    cpu0 = _cpu(worker_pid)
    sent = time.monotonic()
    status, _ = Client(port, token).call("POST", CLAIMS.format(ns="fill") + "/g-0/release", {})
    release_request_ms = round(1000 * (time.monotonic() - sent), 1)
    deadline = time.monotonic() + 120
    while True:
        fit = ResourceClaim.objects.filter(namespace__name="pending", name="fit").values("phase", "allocated_at")[0]
        if fit["phase"] != "Pending" or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    cpu_placed = _cpu(worker_pid) - cpu0
    wait_quiet(timeout=1800)
    cpu_quiet = _cpu(worker_pid) - cpu0
    out = {"pending": waiting, "gpus": gpus, "filled": full, "release_status": status,
           "release_request_ms": release_request_ms,
           "fit_phase": fit["phase"], "first_pass_s": round(first_pass_s, 1)}
    if fit["allocated_at"] is None:
        return {**out, "worker_ms": float("inf"), "worker_cpu_ms": float("inf"), "rounds": 0,
                "wall_ms": float("inf")}
    allocated_at = fit["allocated_at"]
    rounds = [(f, s, t) for f, s, t in AllocationRound.objects.filter(finished_at__gte=released_at)
              .values_list("finished_at", "seconds", "taken")
              if f.timestamp() - s <= allocated_at.timestamp()]
    after = AllocationRound.objects.filter(finished_at__gte=released_at).count()
    return {**out, "worker_ms": round(1000 * sum(s for _, s, _ in rounds), 1), "rounds": len(rounds),
            "worker_cpu_ms": round(1000 * cpu_placed, 1), "worker_cpu_until_quiet_ms": round(1000 * cpu_quiet, 1),
            "claims_taken": sum(t for _, _, t in rounds), "rounds_after_release": after,
            "wall_ms": round((allocated_at - released_at).total_seconds() * 1000, 1),
            "released_at": datetime.fromtimestamp(released_at.timestamp(), UTC).isoformat()}


def _cpu(pid: int) -> float:
    return sum(cpu_seconds(p) for p in process_tree(pid))


def drain_once(stack, port: int, token: str, slots: dict[str, int], n: int, processes: int) -> dict:
    """Worker stopped; ``n`` claims submitted (shapes by their slots, distinct texts); broker emptied; a worker
    of ``processes`` processes started and kicked once. Rate = claims / (first -> last allocation)."""
    import redis

    from claims import dispatch
    from claims.models import ResourceClaim

    ns = f"drain-{processes}"
    stack.stop_one("beat")
    stack.stop_one("worker")
    trace = Trace(slots=slots, texts=10**6, live=n + 4, horizon=1.0)
    bodies = []
    for i in range(n):
        shape, text = trace.pick(0.0)
        bodies.append(claim(f"d-{i}", shape, 30_000 + text))
    post_batches(port, token, ns, bodies)
    redis.Redis.from_url(stack.broker).flushdb()  # the kicks the web queued meanwhile: one kick below, same for both
    stack.start_worker(processes)
    started, since = time.monotonic(), time.time()
    watch = CpuWatch(stack)
    watch.start()
    dispatch.request_allocation()
    wait_quiet(timeout=3600)
    wall = time.monotonic() - started
    cpu = watch.stop()
    rows = list(ResourceClaim.objects.filter(namespace__name=ns, allocated_at__isnull=False)
                .values_list("allocated_at", flat=True))
    first, last = min(rows), max(rows)
    span = (last - first).total_seconds()
    retries = retried(ns)
    release_all(ns)
    per_claim = {k: round(1000 * v / max(1, len(rows)), 2) for k, v in cpu.items() if k.endswith("_s")}
    return {"processes": processes, "allocated": len(rows), "seconds": round(span, 1),
            "claims_per_s": round(len(rows) / span, 1) if span else float("nan"),
            "wall_from_kick_s": round(wall, 1), **round_costs(round_rows(since)), **retries,
            "cpu_ms_per_claim": per_claim, "machine_idle_pct": cpu["idle_pct"]}


def retried(ns: str) -> dict:
    """Claims of ``ns`` that lost a race at commit, that were deferred (not reached in a round's engine time),
    and the decisions made in all beyond one per claim (``status.attempts``)."""
    from django.db.models import Sum

    from claims.models import ClaimEvent, ResourceClaim

    def claims_with(reason: str) -> int:
        return ClaimEvent.objects.filter(namespace=ns, reason=reason).values("claim_uid").distinct().count()

    claims = ResourceClaim.objects.filter(namespace__name=ns)
    extra = (claims.aggregate(n=Sum("attempts"))["n"] or 0) - claims.count()
    return {"claims_lost_at_commit": claims_with("LostRace"), "claims_deferred": claims_with("Deferred"),
            "extra_decisions": extra}


class CpuWatch(threading.Thread):
    """CPU seconds of the worker (all its processes) and of the PostgreSQL backends serving the bench database
    (polled: a backend's CPU is read while it lives), and the machine's idle share, from start to ``stop()``."""

    def __init__(self, stack) -> None:
        super().__init__(daemon=True)
        self.stack, self.halt = stack, threading.Event()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.worker0, self.ticks0 = self._worker(), self._ticks()

    def _worker(self) -> float:
        from benchmarks._soak import cpu_seconds, process_tree

        return sum(cpu_seconds(p) for p in process_tree(self.stack.pid("worker")))

    @staticmethod
    def _ticks() -> list[int]:
        from pathlib import Path

        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]

    def poll(self) -> None:
        from django.db import connection

        from benchmarks._soak import cpu_seconds

        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()")
            for (pid,) in cursor.fetchall():
                cpu = cpu_seconds(pid)
                self.first.setdefault(pid, cpu)
                self.last[pid] = max(cpu, self.last.get(pid, 0.0))

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.halt.wait(0.5):
                self.poll()
        finally:
            connection.close()

    def stop(self) -> dict:
        worker = self._worker() - self.worker0
        self.halt.set()
        self.join()
        ticks = [b - a for a, b in zip(self.ticks0, self._ticks(), strict=True)]
        return {"worker_s": worker, "postgres_s": sum(self.last[p] - self.first[p] for p in self.last),
                "idle_pct": round(100 * (ticks[3] + ticks[4]) / sum(ticks), 1) if sum(ticks) else None}


def drain_phase(stack, token: str, slots: dict[str, int], n: int) -> dict:
    n = min(n, int(0.75 * sum(slots.values())))  # room for all of them: the drain measures placing, not refusing
    one = drain_once(stack, stack.port, token, slots, n, 1)
    print(time.strftime("%H:%M:%S"), "drain, 1 process:", one, flush=True)
    two = drain_once(stack, stack.port, token, slots, n, 2)
    stack.start_beat()
    return {"claims": n, "one": one, "two": two, "speedup": round(two["claims_per_s"] / one["claims_per_s"], 2)}
