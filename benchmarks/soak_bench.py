"""Soak benchmark (issue 14): the live service under a realistic trace for minutes, watched for drift.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice BENCH_BROKER_URL=redis://127.0.0.1:6379/6 \\
        .venv/bin/python benchmarks/soak_bench.py [--minutes 10] [--rate 100] [--check]

What it does (like claims_e2e_bench.py: its own database ``<DATABASE_URL's name>_soak_bench``, ``manage.py
serve`` (gunicorn), a real ``celery worker`` and ``celery beat`` (lease expiry), PostgreSQL and Redis):

1. fleet: BENCH_DEVICES (40,000) devices in 4 clusters of the demo fleet's real shapes: H100 (8 GPUs + 2
   ComputeDomain devices per node), A100 with dynamic MIG (200 partition devices per node, 7 x 1g.10gb per
   GPU by its shared counters), L4 (4 per node), MI300X (8 per node); a quarter of the devices each;
2. prefill to BENCH_FILL (80 %) of the 1-device slots, then the soak: ``--rate`` claims/s for ``--minutes``,
   open loop, one POST each; every claim selects its shape by a CEL selector text of its own among BENCH_TEXTS
   (10,000) distinct ones, BENCH_LIVE (1,000) in use at a time; half end by their lease
   (``draservice.io/lease-ttl``), half by ``POST …/release``; lifetimes follow Little's law and are corrected
   every 5 s to keep the fleet 70-90 % full;
3. burst: BENCH_BURST_SECONDS (60) at twice the rate, to report p99 there;
4. release: the H100 and L4 clusters filled, BENCH_PENDING (4,000) claims pending (2-GPU H100 claims, and last
   one 1-GPU L4 claim), one L4 GPU released: the worker's CPU (``/proc``) until that claim is placed;
5. drain: BENCH_DRAIN (20,000) claims over the 4 clusters submitted with the worker stopped, then drained by a
   worker with 1 process, again with 2 processes;
6. batch (issue 32): BENCH_BATCH_CLAIMS (20,000) claims POSTed to the batch endpoint BENCH_BATCH_SIZE (1,000)
   at a time from BENCH_BATCH_THREADS (2) clients while the worker places them: the CPU of gunicorn, Celery
   and PostgreSQL per placed claim (goal 0.5 ms), claims/s beside it;
7. post (issue 32): BENCH_POSTS (3,000) single POSTs from BENCH_POST_CLIENTS (4) clients: the web's CPU per
   POST (goal 1.2 ms). How CPU is read: benchmarks/_cost.py;
8. lease: leases lapsing at BENCH_LEASE_RATE (80) a second for BENCH_LEASE_SECONDS (90) on clusters whose
   agents heartbeat: how late their notices and releases come (benchmarks/_lease_phase.py; goal: p99 <= 10 s).

``--phase batch,post`` (or any list of the phases) runs only those, without the soak. The bench's namespaces
get room for their pending claims the way an admin gives it (``PATCH …/objectquota``), not from the defaults
every namespace has. The web server is gunicorn alone (``manage.py serve --no-watch-server``), as API clients
reach it in a deployment.

Per minute of the soak it prints: claims placed/s, p50/p99 submit->allocated (server side, ``created_at`` ->
``allocated_at``), fleet fullness, worker and web CPU per placed claim, worker RSS (all its processes, from
/proc), the longest GC pause in the worker (``DRASERVICE_GC_PAUSE_LOG``, see draservice/celery.py), allocation
rounds (``claims.AllocationRound``), their mean duration, the rows each read to bring the devices in use up to
date (mean and max), and the share of round time spent in statements that take locks other workers may hold
(claim rows, cluster rows, device and pool advisory locks) -- both as the rounds log them. For the whole soak
window it prints the CPU of every process of the service per placed claim (``cpu_ms_per_placed``: web, Celery
workers and beat, PostgreSQL's backends and its own processes; benchmarks/_cost.py). The drain phase
reports the same per worker count, with the claims lost at commit to another worker.

Goals (issue 32), judged by CPU where load would inflate wall time: p99 submit->allocated <= 250 ms with the
offered rate placed; the last minute's placements >= 95 % of minute 2's; worker RSS growth <= 5 % after minute 2;
no GC collection over 50 ms of CPU; a release with the pending claims places the fitting one with <= 50 ms of
worker CPU.

Other knobs (environment): BENCH_CLIENTS (32), BENCH_WEB_WORKERS (2), BENCH_WEB_THREADS (32),
BENCH_CELERY_CONCURRENCY (1), BENCH_PHASES (soak,burst,release,drain,batch,post,lease; ``--phase`` wins),
BENCH_LOG_LEVEL and BENCH_CELERY_LOGLEVEL (WARNING: the service's and the worker's logs in bench-results/). Results:
bench-results/soak.json.
Everything runs on this one machine: clients, web server, worker, beat and PostgreSQL share its CPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import _cost as cost  # noqa: E402
from benchmarks import _lease_phase as lease  # noqa: E402
from benchmarks import _soak_phases as phases  # noqa: E402
from benchmarks._live import Stack, bench_database, pct, recreate_database  # noqa: E402
from benchmarks._soak import SHAPES, Driver, Sampler, Trace, gc_pauses  # noqa: E402

BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
BENCH_DB, DB_URL = bench_database(BASE_URL, "soak_bench")
BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
DEVICES = int(os.environ.get("BENCH_DEVICES", "40000"))
FILL = float(os.environ.get("BENCH_FILL", "0.8"))
TEXTS = int(os.environ.get("BENCH_TEXTS", "10000"))
LIVE = int(os.environ.get("BENCH_LIVE", "1000"))
BURST_SECONDS = float(os.environ.get("BENCH_BURST_SECONDS", "60"))
PENDING = int(os.environ.get("BENCH_PENDING", "4000"))
DRAIN = int(os.environ.get("BENCH_DRAIN", "20000"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "32"))
WEB_WORKERS = int(os.environ.get("BENCH_WEB_WORKERS", "2"))
WEB_THREADS = int(os.environ.get("BENCH_WEB_THREADS", "32"))
CONCURRENCY = int(os.environ.get("BENCH_CELERY_CONCURRENCY", "1"))
PHASES = os.environ.get("BENCH_PHASES", "soak,burst,release,drain,batch,post,lease").split(",")
BATCH_CLAIMS = int(os.environ.get("BENCH_BATCH_CLAIMS", "20000"))
BATCH_SIZE = int(os.environ.get("BENCH_BATCH_SIZE", "1000"))
BATCH_THREADS = int(os.environ.get("BENCH_BATCH_THREADS", "2"))
POSTS = int(os.environ.get("BENCH_POSTS", "3000"))
POST_CLIENTS = int(os.environ.get("BENCH_POST_CLIENTS", "4"))
GC_LOG = ROOT / "bench-results" / "soak-gc-pauses.log"


def setup_fleet() -> tuple[str, dict[str, int], dict[str, int]]:
    """Load the 4 clusters through the inventory's sync service. Returns (admin token, slots, nodes) per shape."""
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
    slots, nodes, devices = {}, {}, 0
    for shape in SHAPES:
        count = max(1, round(DEVICES / len(SHAPES) / shape.devices_per_node))
        name = f"soak-{shape.name}"
        clusters.create_cluster(name=name, labels={"shape": shape.name}, with_token=False)
        slices, node_list = [], []
        for i in range(count):
            node = f"{shape.name}-node-{i:05d}"
            slices += demo.node_slices(shape.node_type, node)
            node_list.append({"name": node, "labels": {"kubernetes.io/hostname": node}})
        devices += sync.push_inventory(name, {"resourceSlices": slices, "nodes": node_list})["devices"]
        slots[shape.name], nodes[shape.name] = count * shape.slots_per_node, count
    _, secret = issue_token(kind=APIToken.ADMIN, name="soak bench")
    print(f"{time.strftime('%H:%M:%S')} fleet: {devices} devices in {len(SHAPES)} clusters, nodes {nodes}, "
          f"1-device slots {slots}", flush=True)
    return secret, slots, nodes


def minute_table(t0: float, minutes: int, samples, pauses, rounds, claims) -> list[dict]:
    """Per minute of the soak (unix times [t0 + 60 m, t0 + 60 (m + 1))) from the sampler, the GC log, the
    rounds' log and the claims' timestamps."""
    rows, now = [], time.time()
    before = [s for s in samples if s.at <= t0][-1:] or samples[:1]
    for m in range(minutes):
        lo, hi = t0 + 60 * m, t0 + 60 * (m + 1)
        inside = [s for s in samples if lo < s.at <= hi]
        if not inside or not before:
            break
        first, last = before[-1], inside[-1]
        placed = sum(1 for _, a, _ in claims if a is not None and lo <= a < hi)
        lat, unplaced = phases.latencies(claims, lo, hi, now)
        rs = [r for r in rounds if lo <= r[0] < hi]
        per_claim = 1000 / placed if placed else float("nan")
        rows.append({
            "minute": m + 1, "placed_per_s": round(placed / 60, 1), "p50_ms": round(pct(lat, 50), 1),
            "p99_ms": round(pct(lat, 99), 1), "never_placed": unplaced,
            "full_pct": round(100 * last.allocated / phases.SLOTS_TOTAL[0], 1),
            "worker_cpu_ms_per_claim": round((last.worker_cpu_s - first.worker_cpu_s) * per_claim, 2),
            "web_cpu_ms_per_claim": round((last.web_cpu_s - first.web_cpu_s) * per_claim, 2),
            "worker_rss_mb": round(last.worker_rss_mb), "worker_max_rss_mb": round(last.worker_max_rss_mb),
            "max_gc_ms": round(max((p[3] for p in pauses if lo <= p[0] < hi), default=0.0), 1),
            "max_gc_cpu_ms": round(max((p[4] for p in pauses if lo <= p[0] < hi), default=0.0), 1),
            "rounds": len(rs), "round_mean_ms": round(1000 * sum(r[1] for r in rs) / len(rs), 1) if rs else 0,
            **phases.round_costs(rs),
            "load_1min": round(last.load, 1)})
        before = inside
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'min':>3} {'placed/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'unplaced':>8} {'full%':>5} {'wCPU ms/c':>9} "
          f"{'webCPU ms/c':>11} {'wRSS MB':>7} {'GC max ms (cpu)':>15} {'rounds':>6} {'round ms':>8} "
          f"{'rows/round (max)':>16} {'lock%':>5} {'load':>5}")
    for r in rows:
        gc_text = f"{r['max_gc_ms']} ({r['max_gc_cpu_ms']})"
        print(f"{r['minute']:>3} {r['placed_per_s']:>8} {r['p50_ms']:>7} {r['p99_ms']:>7} {r['never_placed']:>8} "
              f"{r['full_pct']:>5} {r['worker_cpu_ms_per_claim']:>9} {r['web_cpu_ms_per_claim']:>11} "
              f"{r['worker_rss_mb']:>7} {gc_text:>15} {r['rounds']:>6} {r['round_mean_ms']:>8} "
              f"{r['rows_read_per_round']} ({r['rows_read_max']})".rjust(16)
              + f" {str(r['lock_wait_pct']):>5} {r['load_1min']:>5}")
    print("  p50/p99: claims submitted that minute; one never placed counts with its wait until released or the "
          "end (a lower bound). GC: longest wall-clock pause (its CPU time). load: the machine's 1-minute load average")
    print("  rows/round: database rows a round read to bring the devices in use up to date (change log entries "
          "and allocation rows), mean (max); lock%: share of round time in lock-taking statements")


def goals(results: dict, rate: float) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    rows = results.get("minutes") or []
    if "soak" in results:
        if len(rows) >= 3:
            second, last = rows[1], rows[-1]
            # Issue 32's goals: the last minute places >= 95 % of what minute 2 placed; worker CPU per claim
            # stays within 20 % (drift); RSS grows <= 5 % after minute 2.
            ok = last["placed_per_s"] >= 0.95 * second["placed_per_s"]
            out.append((ok, f"placement keeps up: last minute {last['placed_per_s']} placed/s >= 95 % of minute 2's "
                            f"{second['placed_per_s']} (offered {rate:g} claims/s)"))
            key = "worker_cpu_ms_per_claim"
            ok = abs(last[key] - second[key]) <= 0.2 * second[key]
            out.append((ok, f"worker CPU per claim flat: last minute {last[key]} ms within 20 % of minute 2's "
                            f"{second[key]} ms"))
            base = rows[1]["worker_rss_mb"]
            growth = 100 * (results["soak"]["final_worker_rss_mb"] - base) / base if base else float("nan")
            out.append((growth <= 5, f"worker RSS growth after the first two minutes {base} -> "
                                     f"{results['soak']['final_worker_rss_mb']} MB ({growth:+.1f} %) <= 5 %"))
        else:
            out.append((False, "throughput, CPU per claim and RSS flat: not measured (needs --minutes >= 3)"))
        # Judged by CPU: a collection's wall time is mostly waiting for a core on a loaded machine.
        gc_max, gc_cpu = results["soak"]["max_gc_ms"], results["soak"]["max_gc_cpu_ms"]
        out.append((gc_cpu <= 50, f"no GC collection > 50 ms CPU in the worker during the soak (longest "
                                  f"{gc_cpu} ms CPU; {gc_max} ms wall)"))
        s = results["soak"]
        ok = s["p99_ms"] <= 250 and s["placed_per_s"] >= 0.95 * rate
        burst = results.get("burst", {})
        out.append((ok, f"p99 submit->allocated <= 250 ms sustaining {rate:g} claims/s: p99 {s['p99_ms']} ms at "
                        f"{s['placed_per_s']} placed/s (at {2 * rate:g}/s: p99 {burst.get('p99_ms', 'n/a')} ms, "
                        f"{burst.get('placed_per_s', 'n/a')} placed/s)"))
    if "release" in results:
        r = results["release"]
        out.append((r["worker_cpu_ms"] <= 50, f"one release with {r['pending']} pending places the fitting claim "
                                              f"with <= 50 ms of worker CPU ({r['worker_cpu_ms']} ms CPU until it "
                                              f"was seen placed, {r.get('worker_cpu_until_quiet_ms')} ms until "
                                              f"quiet; rounds {r['worker_ms']} ms wall in {r['rounds']}; "
                                              f"{r['wall_ms']} ms release to placed)"))
    if "drain" in results:
        d = results["drain"]
        out.append((d["speedup"] >= 1.4, f"{d['claims']} pre-submitted claims: 2 worker processes drain them >= "
                                         f"1.4x faster than one ({d['one']['claims_per_s']} -> "
                                         f"{d['two']['claims_per_s']} claims/s, {d['speedup']}x)"))
    return out + cost.goals(results) + lease.goals(results)


def soak(stack, token, slots, rate, minutes) -> tuple[dict, Driver]:
    trace = Trace(slots=slots, texts=TEXTS, live=LIVE, horizon=60 * minutes + BURST_SECONDS)
    driver = Driver(stack.port, token, trace, sum(slots.values()), FILL, CLIENTS)
    t = time.monotonic()
    count = int(FILL * sum(slots.values()))
    driver.prefill(count, rate)
    phases.wait_quiet(timeout=1800)
    print(f"{time.strftime('%H:%M:%S')} prefill: {count} claims placed or refused in {time.monotonic() - t:.0f} s; "
          f"soak for {minutes:g} min at {rate:g}/s", flush=True)
    sampler = Sampler(stack, BENCH_DB, driver)
    sampler.start()
    time.sleep(1)
    ledger = cost.CpuLedger(stack)  # every process of the service, PostgreSQL's included (benchmarks/_cost.py)
    ledger.start()
    t0 = time.time()
    results: dict = {"soak": {"rate": rate, "minutes": minutes, **driver.run(rate, 60 * minutes)}}
    t1 = time.time()
    cpu = ledger.stop()
    if "burst" in PHASES and BURST_SECONDS > 0:
        results["burst"] = {"rate": 2 * rate, **driver.run(2 * rate, BURST_SECONDS, 60 * minutes)}
    t2 = time.time()
    time.sleep(3)  # the last claims' rounds
    sampler.stop()
    claims, rounds = phases.trace_rows(), phases.round_rows(t0 - 60)
    pauses = gc_pauses(GC_LOG)
    rows = minute_table(t0, int(minutes), sampler.samples, pauses, rounds, claims)
    results["minutes"] = rows
    during = [p for p in pauses if t0 <= p[0] < t1]
    results["soak"].update(phases.window_stats(claims, t0, t1), max_gc_ms=round(max(
        (p[3] for p in during), default=0.0), 1), max_gc_cpu_ms=round(max((p[4] for p in during), default=0.0), 1),
        final_worker_rss_mb=round([s for s in sampler.samples if s.at <= t1][-1].worker_rss_mb))
    if "burst" in results:
        results["burst"].update(phases.window_stats(claims, t1, t2))
    placed = round(results["soak"]["placed_per_s"] * (t1 - t0))
    results["soak"]["cpu_ms_per_placed"] = {**cost.per_item(cpu, placed), "load": cpu["load"]}
    results["trace"] = {"sent": driver.sent, "errors": driver.errors, "lifetime_factor": round(driver.factor, 2)}
    return results, driver


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=100, help="claims/s of the soak (the burst is twice that)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--phase", help="comma-separated phases to run (default BENCH_PHASES: soak,burst,release,"
                                        "drain,batch,post,lease); e.g. --phase batch,post without the soak")
    args = parser.parse_args()
    if args.phase:
        PHASES[:] = args.phase.split(",")
    unknown = set(PHASES) - {"soak", "burst", "release", "drain", "batch", "post", "lease"}
    if unknown:
        sys.exit(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if not BASE_URL.startswith("postgres"):
        sys.exit("soak_bench needs PostgreSQL: set DATABASE_URL=postgresql://...")
    # The bench's own connections are named, so that their backends' CPU is not counted as the service's.
    os.environ.update(DATABASE_URL=f"{DB_URL}?application_name={cost.BENCH_APP}", CELERY_BROKER_URL=BROKER,
                      LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "WARNING"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
    recreate_database(BASE_URL, BENCH_DB)
    token, slots, nodes = setup_fleet()
    phases.SLOTS_TOTAL[0] = sum(slots.values())
    GC_LOG.parent.mkdir(exist_ok=True)
    GC_LOG.unlink(missing_ok=True)
    stack = Stack(BROKER, web_workers=WEB_WORKERS, web_threads=WEB_THREADS, concurrency=CONCURRENCY, beat=True,
                  prefix="soak-", env={"DRASERVICE_GC_PAUSE_LOG": str(GC_LOG), "DATABASE_URL": DB_URL},
                  watch_server=False, notify_worker=True)
    results: dict = {"devices": DEVICES, "slots": slots, "cpus": os.cpu_count(), "web_workers": WEB_WORKERS,
                     "celery_concurrency": CONCURRENCY, "load_average_before": os.getloadavg()}
    heartbeats = phases.Heartbeats()
    heartbeats.start()
    stack.start()
    driver = None
    try:
        phases.warm_up(stack.port, token)
        for ns in ("team-0", "team-1", "team-2", "team-3", "fill", "pending", "drain-1", "drain-2"):
            cost.raise_cap(stack.port, token, ns, max(DRAIN, sum(slots.values())))
        if "soak" in PHASES:
            out, driver = soak(stack, token, slots, args.rate, args.minutes)
            results.update(out)
            driver.stop()
            print_soak(results, args.rate)  # now: the phases after it take long, and may be interrupted
        phases.release_everything()
        if "release" in PHASES:
            results["release"] = phases.release_phase(stack.port, token, nodes["h100"], nodes["l4"], PENDING,
                                                       stack.pid("worker"))
            print(time.strftime('%H:%M:%S'), "release:", results["release"], flush=True)
            phases.release_everything()
        if "drain" in PHASES:
            results["drain"] = phases.drain_phase(stack, token, slots, DRAIN)
            print(time.strftime('%H:%M:%S'), "drain:", results["drain"], flush=True)
        if "batch" in PHASES:
            results["batch"] = cost.batch_phase(stack, token, slots, BATCH_CLAIMS, BATCH_SIZE, BATCH_THREADS)
            print(time.strftime('%H:%M:%S'), "batch:", results["batch"], flush=True)
        if "post" in PHASES:
            results["post"] = cost.post_phase(stack, token, slots, POSTS, POST_CLIENTS)
            print(time.strftime('%H:%M:%S'), "post:", results["post"], flush=True)
        if "lease" in PHASES:
            results["lease"] = lease.lease_phase(stack.port, token)
            print(time.strftime('%H:%M:%S'), "lease:", results["lease"], flush=True)
    finally:
        if driver is not None:
            driver.stop()
        stack.stop()
        heartbeats.stop()
    results["load_average_after"] = os.getloadavg()
    return report(results, args)


def print_soak(results: dict, rate: float) -> None:
    print()
    if results.get("minutes"):
        print(f"soak at {rate:g} claims/s target, {results['devices']} devices, "
              f"{results['celery_concurrency']} worker process(es):")
        print_table(results["minutes"])
    for name in ("soak", "burst"):
        if name in results:
            print(f"{name}: {results[name]}")
    if "trace" in results:
        print(f"trace: {results['trace']}", flush=True)


def report(results: dict, args) -> int:
    checks = goals(results, args.rate)
    results["goals"] = {text: ok for ok, text in checks}
    (ROOT / "bench-results" / "soak.json").write_text(json.dumps(results, indent=2, default=str))
    print_soak(results, args.rate)
    print(f"load average (1/5/15 min) before {results['load_average_before']}, after "
          f"{results['load_average_after']} on {os.cpu_count()} CPUs shared by clients, web, worker, beat and "
          "PostgreSQL (and whatever else runs on this machine)")
    for ok, text in checks:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    return 1 if args.check and not all(ok for ok, _ in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
