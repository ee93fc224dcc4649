"""What placing claims costs the machine (issue 32, "cost follows change"): CPU of the service's processes per
placed claim for a large batch, and the web server's CPU per single POST. Used by soak_bench.py
(``--phase batch``, ``--phase post``); Django is set up by it before any call.

CPU is read from ``/proc/<pid>/stat`` (utime + stime, and cutime + cstime of children already reaped) at the
start and at the end of the window, per process:

* web: the ``manage.py serve`` process tree (gunicorn's master and its workers);
* celery: the worker's tree (main process and pool children), beat's and the notify worker's (if any);
* postgres: the server's processes, read with ``pg_stat_activity`` every ``POLL`` seconds (a backend's CPU
  can only be read while it lives; the service keeps its connections, ``CONN_MAX_AGE``): the backends of the
  bench's database, except the bench's own connections (``application_name`` ``soak-bench``), and the
  server's own processes (postmaster, WAL writer, checkpointer, background writer, autovacuum launcher),
  which work for every database of the server: counted, and shown apart. Backends of other databases (other
  tenants of this machine's server) are shown, never counted.

The machine's load average is printed beside every figure: on a shared machine a busy neighbour slows the
service but does not add to its CPU time (only to its cache misses).
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks._live import Client, release_all
from benchmarks._soak import CLAIMS, Trace, claim, cpu_seconds, process_tree

BENCH_APP = "soak-bench"  # the application_name of the bench's own connections (not counted)
POLL = 0.2
BATCH_GOAL_MS = 0.5  # total CPU per placed claim of a 20,000-claim batch
POST_GOAL_MS = 1.2  # web CPU per single POST
QUOTA = "/api/v1/namespaces/{ns}/objectquota"


def raise_cap(port: int, token: str, ns: str, pending: int) -> None:
    """Give the bench's namespace room for ``pending`` pending claims, the way an admin does it
    (``PATCH …/objectquota``, ``claims.services.caps``). Before the namespace's first claim: no web process
    has its caps cached yet, so every one reads the new cap."""
    status, body = Client(port, token).call("PATCH", QUOTA.format(ns=ns),
                                            {"spec": {"hard": {"pending-claims": max(pending, 5000)}}})
    if status != 200:
        raise SystemExit(f"raising the pending-claims cap of {ns}: {status} {str(body)[:300]}")


def reset_cap(port: int, token: str, ns: str) -> None:
    Client(port, token).call("DELETE", QUOTA.format(ns=ns))


def _postgres_processes() -> dict[int, str]:
    """pid -> ``ours`` | ``server`` | ``other`` of every process of the PostgreSQL server (see the module
    docstring)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, datname = current_database(), coalesce(application_name, ''), backend_type "
                       "FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
        rows = cursor.fetchall()
    out: dict[int, str] = {}
    parent = 0
    for pid, same_db, app, kind in rows:
        if kind in ("client backend", "autovacuum worker", "parallel worker", "walsender"):
            if same_db and app != BENCH_APP:
                out[pid] = "ours"
            elif not same_db:
                out[pid] = "other"
        else:
            out[pid] = "server"
        parent = parent or _ppid(pid)
    if parent:
        out[parent] = "server"  # the postmaster
    return out


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU of the process itself (not of its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class CpuLedger(threading.Thread):
    """CPU seconds per part (web, celery, postgres: ours / server / other) from ``start()`` to ``stop()``."""

    def __init__(self, stack) -> None:
        super().__init__(daemon=True)
        self.stack, self.halt = stack, threading.Event()
        self.base: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}

    def _service(self) -> dict[int, str]:
        parts = {pid: "web" for pid in process_tree(self.stack.pid("web"))}
        for name in ("worker", "beat", "notify-worker"):
            if name in self.stack.procs:
                parts.update({pid: "celery" for pid in process_tree(self.stack.pid(name))})
        return parts

    def _read(self) -> None:
        parts = {**_postgres_processes(), **self._service()}
        for pid, part in parts.items():
            # PostgreSQL's processes: their own time only. The postmaster's reaped children are every backend
            # that ended since it started, other databases' too.
            cpu = cpu_seconds(pid) if part in ("web", "celery") else own_cpu_seconds(pid)
            if cpu or pid not in self.last:
                self.last[pid] = (part, max(cpu, self.last.get(pid, ("", 0.0))[1]))

    def start(self) -> None:
        self._read()
        self.base = {pid: cpu for pid, (_, cpu) in self.last.items()}  # a process born later starts at 0
        self.t0, self.load0 = time.monotonic(), os.getloadavg()
        super().start()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.halt.wait(POLL):
                self._read()
        finally:
            connection.close()

    def stop(self) -> dict:
        self.halt.set()
        self.join()
        self._read()
        out = {"web_s": 0.0, "celery_s": 0.0, "postgres_ours_s": 0.0, "postgres_server_s": 0.0,
               "postgres_other_dbs_s": 0.0}
        for pid, (part, cpu) in self.last.items():
            key = f"postgres_{part}_s" if part in ("ours", "server") else (
                "postgres_other_dbs_s" if part == "other" else f"{part}_s")
            out[key] += max(0.0, cpu - self.base.get(pid, 0.0))
        out["total_s"] = out["web_s"] + out["celery_s"] + out["postgres_ours_s"] + out["postgres_server_s"]
        out["wall_s"] = time.monotonic() - self.t0
        out["load"] = [round(x, 2) for x in (*self.load0, *os.getloadavg())]
        return out


def per_item(cpu: dict, n: int) -> dict:
    """CPU ms per item of each part."""
    return {k[:-2] + "_ms": round(1000 * v / max(1, n), 3) for k, v in cpu.items() if k.endswith("_s")
            and k != "wall_s"}


def batch_phase(stack, token: str, slots: dict[str, int], n: int, per_post: int, threads: int) -> dict:
    """``n`` claims (the fleet's shapes by their slots, each with the shape's plain selector: one job's many
    tasks) POSTed to the batch endpoint ``per_post`` at a time from ``threads`` clients, with the worker
    placing them as they come; CPU from the first POST until every claim is decided."""
    from benchmarks._soak_phases import wait_quiet
    from claims.models import ResourceClaim

    ns = "batch"
    n = min(n, int(0.75 * sum(slots.values())))  # room for all of them: the batch measures placing
    raise_cap(stack.port, token, ns, n)
    trace = Trace(slots=slots)
    bodies = [claim(f"b-{i}", trace.pick(0.0)[0], None) for i in range(n)]
    ledger = CpuLedger(stack)
    ledger.start()
    started = time.time()
    _post_all(stack.port, token, ns, bodies, per_post, threads)
    posted = time.time()
    wait_quiet(timeout=3600)
    cpu = ledger.stop()
    rows = ResourceClaim.objects.filter(namespace__name=ns)
    placed = rows.filter(allocated_at__isnull=False).count()
    last = max(rows.filter(allocated_at__isnull=False).values_list("allocated_at", flat=True), default=None)
    span = (last.timestamp() - started) if last is not None else float("nan")
    release_all(ns)
    wait_quiet()
    reset_cap(stack.port, token, ns)
    per = per_item(cpu, placed)
    return {"claims": n, "per_post": per_post, "threads": threads, "placed": placed,
            "post_s": round(posted - started, 1), "first_post_to_last_placed_s": round(span, 1),
            "claims_per_s": round(placed / span, 1) if span == span and span > 0 else None,
            "cpu_s": {k: round(v, 2) for k, v in cpu.items() if k.endswith("_s")}, "cpu_ms_per_claim": per,
            "load": cpu["load"]}


def _post_all(port: int, token: str, ns: str, bodies: list[dict], per_post: int, threads: int) -> None:
    local = threading.local()

    def send(items: list[dict]) -> None:
        client = getattr(local, "client", None) or Client(port, token)
        local.client = client
        status, body = client.call("POST", CLAIMS.format(ns=ns) + "/batch", {"items": items})
        if status != 201:
            raise SystemExit(f"batch POST to {ns}: {status} {str(body)[:300]}")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for f in [pool.submit(send, bodies[i:i + per_post]) for i in range(0, len(bodies), per_post)]:
            f.result()


def post_phase(stack, token: str, slots: dict[str, int], n: int, clients: int) -> dict:
    """``n`` claims, one POST each, from ``clients`` keep-alive clients as fast as they are answered; the
    worker places them meanwhile. The web's CPU over the POSTs (first sent to last answered) per POST; the
    others' CPU over the same window is shown too, for what it is (the worker's share runs on after it)."""
    from benchmarks._soak_phases import wait_quiet

    ns = "post"
    n = min(n, int(0.75 * sum(slots.values())))
    raise_cap(stack.port, token, ns, n)
    trace = Trace(slots=slots)
    bodies = [claim(f"s-{i}", trace.pick(0.0)[0], None) for i in range(n)]
    local = threading.local()
    errors: dict[int, int] = {}
    lock = threading.Lock()

    def send(body: dict) -> None:
        client = getattr(local, "client", None) or Client(stack.port, token)
        local.client = client
        status, _ = client.call("POST", CLAIMS.format(ns=ns), body)
        if status != 201:
            with lock:
                errors[status] = errors.get(status, 0) + 1

    def livez(_) -> None:
        client = getattr(local, "client", None) or Client(stack.port, token)
        local.client = client
        client.call("GET", "/livez")

    with ThreadPoolExecutor(max_workers=clients) as pool:
        for f in [pool.submit(send, b) for b in bodies[:clients]]:  # every client's connection open first
            f.result()
        # The server's floor beside it: the same clients' GET /livez (a view that reads nothing), as much web CPU
        # per request as gunicorn, Django's middleware and the machine's syscalls cost at this load.
        floor = CpuLedger(stack)
        floor.start()
        list(pool.map(livez, range(n - clients)))
        floor_cpu = floor.stop()
        ledger = CpuLedger(stack)
        ledger.start()
        for f in [pool.submit(send, b) for b in bodies[clients:]]:
            f.result()
        cpu = ledger.stop()
    wait_quiet(timeout=1800)
    release_all(ns)
    wait_quiet()
    reset_cap(stack.port, token, ns)
    measured = n - clients
    return {"posts": measured, "clients": clients, "errors": errors, "wall_s": round(cpu["wall_s"], 1),
            "posts_per_s": round(measured / cpu["wall_s"], 1) if cpu["wall_s"] else None,
            "cpu_ms_per_post": per_item(cpu, measured), "load": cpu["load"],
            "floor_web_ms_per_get": round(1000 * floor_cpu["web_s"] / max(1, n - clients), 3)}


def goals(results: dict) -> list[tuple[bool, str]]:
    out = []
    if "batch" in results:
        b = results["batch"]
        total = b["cpu_ms_per_claim"]["total_ms"]
        out.append((total <= BATCH_GOAL_MS and b["placed"] == b["claims"],
                    f"batch: total CPU <= {BATCH_GOAL_MS} ms per placed claim over {b['claims']} claims "
                    f"({b['per_post']} per POST): {total} ms (web {b['cpu_ms_per_claim']['web_ms']}, celery "
                    f"{b['cpu_ms_per_claim']['celery_ms']}, postgres {b['cpu_ms_per_claim']['postgres_ours_ms']} "
                    f"+ server {b['cpu_ms_per_claim']['postgres_server_ms']}); {b['placed']} placed, "
                    f"{b['claims_per_s']} claims/s; load {b['load']}"))
    if "post" in results:
        p = results["post"]
        web = p["cpu_ms_per_post"]["web_ms"]
        out.append((web <= POST_GOAL_MS and not p["errors"],
                    f"single POST: web CPU <= {POST_GOAL_MS} ms per POST over {p['posts']} POSTs "
                    f"({p['clients']} clients): {web} ms, {p['posts_per_s']} POSTs/s, errors {p['errors']} (the "
                    f"server's floor, GET /livez: {p['floor_web_ms_per_get']} ms); load {p['load']}"))
    return out
