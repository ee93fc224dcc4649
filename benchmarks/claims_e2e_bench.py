"""End-to-end claims benchmark: real web server, real Celery workers, PostgreSQL and Redis.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python benchmarks/claims_e2e_bench.py

What it does:
1. creates a fresh database ``<DATABASE_URL's name>_claims_bench`` and migrates it; loads a 500-node x
   10-device fleet (the demo fleet's H100 nodes: 8 GPUs + 2 ComputeDomain devices each, over 2 clusters)
   through the inventory's sync service; makes an admin token;
2. starts ``manage.py serve`` (gunicorn, threaded) and ``celery worker`` against BENCH_BROKER_URL (default
   redis://127.0.0.1:6379/14, FLUSHED at start: the benchmark owns that Redis database);
3. measures, each phase on its own namespace, freeing all devices in between:
   * single: one claim per POST from CLIENTS threads, as fast as they go;
   * batch: the batch endpoint, BATCH claims per POST;
   * lifecycle: the web CPU per request of the rest of a placed claim's life, each kind timed on its own:
     BENCH_LIFECYCLE claims POSTed, then (allocated) each read by a GET, then each released over HTTP;
   * steady: an open-loop 50 claims/s, each followed by ``GET …?wait=30s`` as a CI job would do.
   Throughput is claims / (first POST -> last claim allocated). Latency submit->allocated is measured on the
   server (``created_at`` -> ``allocated_at``, one clock) and, in the steady phase, also by the client
   (POST sent -> long poll answered "Allocated"). The single and batch phases also report the CPU the web
   server and the Celery worker spent per claim (their processes' user + system time over the phase).

Knobs (environment): BENCH_NODES (500), BENCH_SINGLE (1500), BENCH_BATCHED (3000), BENCH_BATCH (100),
BENCH_CLIENTS (16), BENCH_STEADY_RATE (50), BENCH_STEADY_SECONDS (20), BENCH_WEB_WORKERS (2),
BENCH_WEB_THREADS (32), BENCH_CELERY_CONCURRENCY (1), BENCH_LIFECYCLE (1000), BENCH_PHASES
(single,batch,lifecycle,steady). Results are printed and
written to bench-results/claims_e2e.json.

Everything runs on this one machine, so clients, web server, worker and PostgreSQL share its CPUs.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._live import Client, Stack, bench_database, pct, release_all  # noqa: E402
from benchmarks._live import recreate_database as _recreate  # noqa: E402
from benchmarks._live import wait_all_decided as wait_all_allocated  # noqa: E402
from benchmarks._soak import cpu_seconds, process_tree  # noqa: E402

BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
if not BASE_URL.startswith("postgres"):
    sys.exit("claims_e2e_bench needs PostgreSQL: set DATABASE_URL=postgresql://...")
BENCH_DB, DB_URL = bench_database(BASE_URL, "claims_bench")
BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")

NODES = int(os.environ.get("BENCH_NODES", "500"))
SINGLE = int(os.environ.get("BENCH_SINGLE", "1500"))
BATCHED = int(os.environ.get("BENCH_BATCHED", "3000"))
BATCH = int(os.environ.get("BENCH_BATCH", "100"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "16"))
RATE = float(os.environ.get("BENCH_STEADY_RATE", "50"))
STEADY_SECONDS = float(os.environ.get("BENCH_STEADY_SECONDS", "20"))
WEB_WORKERS = int(os.environ.get("BENCH_WEB_WORKERS", "2"))
WEB_THREADS = int(os.environ.get("BENCH_WEB_THREADS", "32"))
PHASES = os.environ.get("BENCH_PHASES", "single,batch,lifecycle,steady").split(",")
LIFECYCLE = int(os.environ.get("BENCH_LIFECYCLE", "1000"))
CELERY_CONCURRENCY = int(os.environ.get("BENCH_CELERY_CONCURRENCY", "1"))

os.environ.update(DATABASE_URL=DB_URL, CELERY_BROKER_URL=BROKER, LOG_LEVEL="WARNING")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")


def recreate_database() -> None:
    _recreate(BASE_URL, BENCH_DB)


def setup_fleet() -> str:
    import django

    django.setup()
    from django.core.management import call_command

    from draservice.models import APIToken
    from draservice.tokens import issue_token
    from inventory import demo
    from inventory.models import DeviceClass
    from inventory.services import clusters, fleet, sync

    call_command("migrate", verbosity=0)
    for obj in demo.standard_device_classes():
        fleet.create_fleet_object(DeviceClass, obj)
    per_cluster = [NODES - NODES // 2, NODES // 2]
    devices = 0
    for c, count in enumerate(per_cluster):
        name = f"bench-{c}"
        clusters.create_cluster(name=name, labels={"region": f"r{c}"}, with_token=False)
        slices, nodes = [], []
        for i in range(count):
            node = f"{name}-node-{i:04d}"
            slices += demo.node_slices("h100", node)
            nodes.append({"name": node, "labels": {"kubernetes.io/hostname": node}})
        devices += sync.push_inventory(name, {"resourceSlices": slices, "nodes": nodes})["devices"]
    _, secret = issue_token(kind=APIToken.ADMIN, name="claims bench")
    print(f"fleet: {NODES} nodes, {devices} devices in {len(per_cluster)} clusters")
    return secret


def claim(name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def server_stats(namespace: str, started_wall) -> dict:
    from claims.models import ResourceClaim

    rows = list(ResourceClaim.objects.filter(namespace__name=namespace).values_list("phase", "created_at",
                                                                                    "allocated_at"))
    allocated = [(c, a) for phase, c, a in rows if phase == "Allocated"]
    lat = [(a - c).total_seconds() * 1000 for c, a in allocated]
    last = max(a for _, a in allocated)
    span = (last - started_wall).total_seconds()
    return {"claims": len(rows), "allocated": len(allocated), "seconds": round(span, 2),
            "claims_per_s": round(len(allocated) / span, 1), "p50_ms": round(pct(lat, 50), 1),
            "p99_ms": round(pct(lat, 99), 1), "max_ms": round(max(lat), 1)}


def stack_cpu(stack: Stack) -> tuple[float, float]:
    """CPU seconds used so far by the web server (gunicorn's arbiter and workers) and by the Celery worker."""
    return tuple(sum(cpu_seconds(p) for p in process_tree(stack.pid(name))) for name in ("web", "worker"))


def cpu_per_claim(stack: Stack, before: tuple[float, float], claims: int) -> dict:
    """Web and worker CPU per claim since ``before``: what a phase cost the service, whatever else ran."""
    after = stack_cpu(stack)
    return {f"{name}_cpu_ms_per_claim": round((a - b) * 1000 / claims, 2)
            for name, a, b in zip(("web", "worker"), after, before, strict=True)}


def warm_up(port: int, token: str) -> None:
    """Let the worker build its fleet snapshot and engine (done once per process) before measuring."""
    client = Client(port, token)
    for i in range(5):
        client.call("POST", "/api/v1/namespaces/bench-warmup/resourceclaims", claim(f"w-{i}"))
    wait_all_allocated("bench-warmup", 5, timeout=120)
    release_all("bench-warmup")


def phase_single(stack: Stack, token: str) -> dict:
    port = stack.port
    from django.utils import timezone

    ns = "bench-single"
    names = iter(range(SINGLE))
    lock = threading.Lock()
    errors = []

    def run():
        client = Client(port, token)
        while True:
            with lock:
                i = next(names, None)
            if i is None:
                return
            status, body = client.call("POST", f"/api/v1/namespaces/{ns}/resourceclaims", claim(f"s-{i}"))
            if status != 201:
                errors.append((status, body))

    start = timezone.now()
    cpu_before = stack_cpu(stack)
    t0, cpu0 = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=run) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submit_s = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    if errors:
        raise SystemExit(f"single: {len(errors)} errors, first {errors[0]}")
    wait_all_allocated(ns, SINGLE)
    out = server_stats(ns, start) | cpu_per_claim(stack, cpu_before, SINGLE)
    out["submit_per_s"] = round(SINGLE / submit_s, 1)
    out["client_cpu_share"] = round(client_cpu / submit_s, 2)  # CPUs the load generator itself used
    release_all(ns)
    return out


def phase_batch(stack: Stack, token: str) -> dict:
    port = stack.port
    from django.utils import timezone

    ns = "bench-batch"
    batches = [[claim(f"b-{i}") for i in range(start, min(BATCHED, start + BATCH))]
               for start in range(0, BATCHED, BATCH)]
    it = iter(batches)
    lock = threading.Lock()
    errors = []

    def run():
        client = Client(port, token)
        while True:
            with lock:
                items = next(it, None)
            if items is None:
                return
            status, body = client.call("POST", f"/api/v1/namespaces/{ns}/resourceclaims/batch", {"items": items})
            if status != 201:
                errors.append((status, body))

    start = timezone.now()
    cpu_before = stack_cpu(stack)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submit_s = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"batch: {len(errors)} errors, first {errors[0]}")
    wait_all_allocated(ns, BATCHED)
    out = server_stats(ns, start) | cpu_per_claim(stack, cpu_before, BATCHED)
    out["submit_per_s"] = round(BATCHED / submit_s, 1)
    out["batch_size"] = BATCH
    release_all(ns)
    return out


def _each(stack: Stack, token: str, n: int, call) -> float:
    """``call(client, i)`` for i < n from CLIENTS threads; the web server's CPU per call in ms."""
    names = iter(range(n))
    lock = threading.Lock()

    def run():
        client = Client(stack.port, token)
        while True:
            with lock:
                i = next(names, None)
            if i is None:
                return
            call(client, i)

    before = stack_cpu(stack)[0]
    threads = [threading.Thread(target=run) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return round((stack_cpu(stack)[0] - before) * 1000 / n, 2)


def phase_lifecycle(stack: Stack, token: str) -> dict:
    """A placed claim's web requests, each kind timed on its own: its POST, a GET once it is allocated (what a
    holder's poll ends with) and its release (POST …/release). Web CPU per request of each kind."""
    ns, n = "bench-lifecycle", LIFECYCLE
    path = f"/api/v1/namespaces/{ns}/resourceclaims"
    errors: list = []

    def expect(status: int, body: dict, want: int) -> None:
        if status != want:
            errors.append((status, body))

    out = {"claims": n, "post_web_cpu_ms": _each(stack, token, n, lambda c, i: expect(
        *c.call("POST", path, claim(f"l-{i}")), 201))}
    wait_all_allocated(ns, n)
    out["get_web_cpu_ms"] = _each(stack, token, n, lambda c, i: expect(*c.call("GET", f"{path}/l-{i}"), 200))
    out["release_web_cpu_ms"] = _each(stack, token, n, lambda c, i: expect(
        *c.call("POST", f"{path}/l-{i}/release"), 200))
    if errors:
        raise SystemExit(f"lifecycle: {len(errors)} errors, first {errors[0]}")
    return out


def phase_steady(stack: Stack, token: str) -> dict:
    port = stack.port
    from django.utils import timezone

    ns = "bench-steady"
    n = int(RATE * STEADY_SECONDS)
    local = threading.local()
    client_ms: list[float] = []
    post_ms: list[float] = []
    errors = []

    def one(i: int) -> None:
        client = getattr(local, "client", None) or Client(port, token)
        local.client = client
        t = time.perf_counter()
        status, body = client.call("POST", f"/api/v1/namespaces/{ns}/resourceclaims", claim(f"t-{i}"))
        post_ms.append((time.perf_counter() - t) * 1000)
        if status != 201:
            errors.append((status, body))
            return
        status, body = client.call("GET", f"/api/v1/namespaces/{ns}/resourceclaims/t-{i}?wait=30s")
        if body.get("status", {}).get("phase") != "Allocated":
            errors.append((status, body.get("status")))
            return
        client_ms.append((time.perf_counter() - t) * 1000)

    start = timezone.now()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=64) as pool:
        for i in range(n):
            delay = t0 + i / RATE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i)
    if errors:
        raise SystemExit(f"steady: {len(errors)} errors, first {errors[0]}")
    out = server_stats(ns, start)
    out.update(rate=RATE, client_p50_ms=round(pct(client_ms, 50), 1), client_p99_ms=round(pct(client_ms, 99), 1),
               client_max_ms=round(max(client_ms), 1), post_p50_ms=round(pct(post_ms, 50), 1),
               post_p99_ms=round(pct(post_ms, 99), 1))
    release_all(ns)
    return out


def main() -> None:
    recreate_database()
    token = setup_fleet()
    stack = Stack(BROKER, web_workers=WEB_WORKERS, web_threads=WEB_THREADS, concurrency=CELERY_CONCURRENCY)
    stack.start()
    results = {"nodes": NODES, "cpus": os.cpu_count(), "web_workers": WEB_WORKERS,
               "celery_concurrency": CELERY_CONCURRENCY, "load_average_before": os.getloadavg()}
    try:
        warm_up(stack.port, token)
        for name, phase in (("single", phase_single), ("batch", phase_batch), ("lifecycle", phase_lifecycle),
                            ("steady", phase_steady)):
            if name in PHASES:
                results[name] = phase(stack, token)
                print(f"{name}:", results[name])
    finally:
        stack.stop()
    results["load_average_after"] = os.getloadavg()
    checks = {"single >= 200 claims/s": ("single", lambda r: r["claims_per_s"] >= 200),
              "batched >= 1000 claims/s": ("batch", lambda r: r["claims_per_s"] >= 1000),
              "p99 <= 500 ms at 50/s (server)": ("steady", lambda r: r["p99_ms"] <= 500),
              "p99 <= 500 ms at 50/s (client)": ("steady", lambda r: r["client_p99_ms"] <= 500)}
    goals = {goal: check(results[name]) for goal, (name, check) in checks.items() if name in results}
    results["goals"] = goals
    (ROOT / "bench-results" / "claims_e2e.json").write_text(json.dumps(results, indent=2))
    print()
    print(f"{'phase':<10} {'claims/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'web CPU ms/claim':>17} {'worker CPU':>10}")
    for name in (p for p in ("single", "batch", "steady") if p in results):
        r = results[name]
        print(f"{name:<10} {r['claims_per_s']:>9} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r.get('web_cpu_ms_per_claim', ''):>17} {r.get('worker_cpu_ms_per_claim', ''):>10}")
    print(f"load average (1/5/15 min) before {results['load_average_before']}, after {results['load_average_after']} "
          f"on {os.cpu_count()} CPUs shared by clients, web, worker and PostgreSQL")
    if "lifecycle" in results:
        r = results["lifecycle"]
        print(f"web CPU per request (ms): POST {r['post_web_cpu_ms']}, GET of an allocated claim "
              f"{r['get_web_cpu_ms']}, release {r['release_web_cpu_ms']}")
    if "steady" in results:
        print(f"steady, client-side submit->allocated: p50 {results['steady']['client_p50_ms']} ms, "
              f"p99 {results['steady']['client_p99_ms']} ms")
    for goal, ok in goals.items():
        print(f"  {'met ' if ok else 'MISSED'}  {goal}")


if __name__ == "__main__":
    main()
