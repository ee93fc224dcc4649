"""What one release costs the worker with a long pending queue in the freed device's cluster.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice \
        .venv/bin/python benchmarks/release_bench.py [--pending 10000] [--releases 3] [--vs REV [--runs 3]]

Builds its own database (``<DATABASE_URL's name>_release_bench``): one cluster of ``--devices`` H100s (8 per
node), every device in use, then ``--pending`` one-GPU claims, all decided once (pending, waiting for a
release). Then, ``--releases`` times: release one claim and run allocation rounds in this process until none
takes a claim, as the worker's task does. With ``BENCH_BROKER_URL`` (a broker nobody reads) the release's kick
goes there and the release (the web's part) is not counted; without one its kick runs the rounds inline and
its CPU is counted too (an upper bound). Counted per release: the worker's CPU (``time.process_time``: load
does not inflate it, unlike wall time), the claims decided (``attempts``), and whether the fitting claim --
the oldest pending, first in the scheduler's order -- was placed.

Goals: worker CPU <= 50 ms and <= 10 claims decided per release, the fitting claim placed (``met``/``MISSED``).

``--vs REV``: the same measurement of REV from a git worktree of it (made under bench-results/, with this
interpreter), alternating with this tree, ``--runs`` runs each; prints both medians and the ratio. REV needs
no copy of this file: the run imports the tree given by ``--tree``.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CPU_GOAL_MS = 50.0
DECIDED_GOAL = 10


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(tree: Path, devices: int, pending: int, releases: int, suffix: str, profile: str = "") -> dict:
    """One run in this process against the code of ``tree``; returns its figures."""
    sys.path.insert(0, str(tree))
    from benchmarks._live import bench_database, recreate_database

    base = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
    if not base.startswith("postgres"):
        sys.exit("release_bench needs PostgreSQL: set DATABASE_URL=postgresql://...")
    name, url = bench_database(base, f"release_bench_{suffix}")
    recreate_database(base, name)
    # BENCH_BROKER_URL: a broker nobody reads, so the release's kick does not run the round inside the release
    # (then the release is not counted). Without one the round runs inline and the release's own CPU is counted
    # too: an upper bound.
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="draservice.settings", LOG_LEVEL="WARNING",
                      NAMESPACE_MAX_PENDING_CLAIMS=str(pending + 10),
                      CELERY_BROKER_URL=os.environ.get("BENCH_BROKER_URL", ""))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db.models import Sum

    from claims.models import Phase, ResourceClaim
    from claims.services import claims as claim_services
    from draservice import dispatch
    from scheduler.services import allocation
    from tests.claims.fleet import gpu_claim, load_fleet

    call_command("migrate", verbosity=0)
    load_fleet({"c1": [("h100", max(1, devices // 8))]})

    def rounds() -> None:
        while allocation.allocate_round().taken:
            pass

    def create(ns: str, prefix: str, n: int) -> None:
        for start in range(0, n, 1000):
            batch = [gpu_claim(f"{prefix}-{i:05d}") for i in range(start, min(n, start + 1000))]
            claim_services.create_claims(ns, batch)

    create("fill", "f", max(1, devices // 8) * 8)
    rounds()
    create("team", "p", pending)
    rounds()
    assert ResourceClaim.objects.filter(phase=Phase.PENDING).count() == pending
    deferred = _Deferred()  # the plan pass the rounds ask for: run after them and counted on its own
    dispatch.add_local_runner(deferred)
    out = []
    holders = list(ResourceClaim.objects.filter(namespace__name="fill", phase=Phase.ALLOCATED).order_by("id")
                   .values_list("id", flat=True)[:releases])
    profiler = cProfile.Profile(time.process_time) if profile else None  # CPU, as counted
    for holder in holders:
        if profiler:
            profiler.enable()
        fitting = ResourceClaim.objects.filter(phase=Phase.PENDING).order_by("created_at", "id").first()
        before = ResourceClaim.objects.aggregate(n=Sum("attempts"))["n"]
        cpu = time.process_time()
        claim_services.release_claim(holder)  # without a broker its kick runs the rounds inline, on commit
        if os.environ["CELERY_BROKER_URL"]:
            cpu = time.process_time()  # the rounds below are the worker's part
        rounds()
        plan_cpu = time.process_time()
        cpu = (plan_cpu - cpu) * 1000
        deferred.run()
        plan_cpu = (time.process_time() - plan_cpu) * 1000
        if profiler:
            profiler.disable()
        decided = ResourceClaim.objects.aggregate(n=Sum("attempts"))["n"] - before
        placed = ResourceClaim.objects.get(id=fitting.id).phase == Phase.ALLOCATED
        out.append({"cpu_ms": cpu + plan_cpu, "rounds_ms": cpu, "plan_ms": plan_cpu, "decided": decided,
                    "placed": placed})
    if profiler:
        profiler.dump_stats(profile)
    dispatch.remove_local_runner(deferred)
    return {"cpu_ms": statistics.median(r["cpu_ms"] for r in out),
            "rounds_ms": statistics.median(r["rounds_ms"] for r in out),
            "plan_ms": statistics.median(r["plan_ms"] for r in out), "decided": max(r["decided"] for r in out),
            "placed": all(r["placed"] for r in out), "load": load()}


class _Deferred:
    """A local runner (``draservice.dispatch``) for the tasks the rounds ask for after them (the walltime plan's
    pass, on its own task since the plan left the allocation task): run by ``run`` once the rounds are done, so
    that its CPU is counted, and shown, apart. A tree whose rounds run the plan inline has none."""

    TASKS = ("scheduler.tasks.plan",)

    def __init__(self) -> None:
        self.wanted: set[str] = set()

    def serves(self, name: str) -> bool:
        return name in self.TASKS

    def kick(self, name: str) -> None:
        self.wanted.add(name)

    def run(self) -> None:
        from draservice.celery import app

        wanted, self.wanted = self.wanted, set()
        for name in sorted(wanted):
            app.tasks[name].apply(throw=True)


def verdict(r: dict) -> str:
    ok = r["cpu_ms"] <= CPU_GOAL_MS and r["decided"] <= DECIDED_GOAL and r["placed"]
    return "met" if ok else "MISSED"


def vs(rev: str, runs: int, args: argparse.Namespace) -> None:
    other = HERE / "bench-results" / f"release-bench-{rev.replace('/', '_')}"
    if not other.exists():
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(other), rev], check=True)
    results: dict[str, list[dict]] = {"this": [], rev: []}
    for i in range(runs):
        for label, tree in ((("this", HERE), (rev, other)) if i % 2 == 0 else ((rev, other), ("this", HERE))):
            # -S and the tree first on the path: the virtualenv's editable install would otherwise import this
            # checkout's packages for REV too.
            env = dict(os.environ, PYTHONPATH=f"{tree}:{sysconfig.get_paths()['purelib']}")
            cmd = [sys.executable, "-S", str(Path(__file__).resolve()), "--tree", str(tree), "--json",
                   "--devices", str(args.devices), "--pending", str(args.pending), "--releases", str(args.releases),
                   "--suffix", "vs_this" if label == "this" else "vs_rev"]
            line = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tree,
                                  env=env).stdout.strip()
            r = json.loads(line.splitlines()[-1])
            results[label].append(r)
            print(f"{label:>6s} run {i + 1}: worker CPU {r['cpu_ms']:.1f} ms (rounds {r.get('rounds_ms', 0):.1f}, "
                  f"plan pass {r.get('plan_ms', 0):.1f}), {r['decided']} decided, "
                  f"placed={r['placed']} (load {r['load']})", flush=True)
    this = statistics.median(r["cpu_ms"] for r in results["this"])
    them = statistics.median(r["cpu_ms"] for r in results[rev])
    print(f"median worker CPU per release: this {this:.1f} ms, {rev} {them:.1f} ms: {them / max(this, 1e-6):.0f}x "
          f"less (load {load()})")
    worst = {"cpu_ms": this, "decided": max(r["decided"] for r in results["this"]),
             "placed": all(r["placed"] for r in results["this"])}
    print(f"goal <= {CPU_GOAL_MS:.0f} ms worker CPU and <= {DECIDED_GOAL} decided per release: {verdict(worst)}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=int(os.environ.get("BENCH_DEVICES", "1024")))
    p.add_argument("--pending", type=int, default=int(os.environ.get("BENCH_PENDING", "10000")))
    p.add_argument("--releases", type=int, default=3)
    p.add_argument("--vs", metavar="REV")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tree", type=Path, default=HERE)
    p.add_argument("--suffix", default="this")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", metavar="FILE", default="", help="cProfile the releases and their rounds into FILE")
    args = p.parse_args()
    if args.vs:
        vs(args.vs, args.runs, args)
        return
    r = measure(args.tree, args.devices, args.pending, args.releases, args.suffix, args.profile)
    if args.json:
        print(json.dumps(r))
        return
    print(f"release with {args.pending} pending ({args.devices} devices, one cluster): worker CPU {r['cpu_ms']:.1f} ms "
          f"(median of {args.releases}; rounds {r['rounds_ms']:.1f}, the plan pass after them {r['plan_ms']:.1f}), "
          f"{r['decided']} claims decided, fitting claim placed={r['placed']} "
          f"(load {r['load']})")
    print(f"goal <= {CPU_GOAL_MS:.0f} ms worker CPU and <= {DECIDED_GOAL} decided per release: {verdict(r)}")


if __name__ == "__main__":
    main()
