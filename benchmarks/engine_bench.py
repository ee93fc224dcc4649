"""Matching-engine benchmark: claims/s and p50/p99 latency per claim, engine only, one process.

Shapes (from issue 4):
  fill          500 nodes x 10 devices, filled by 5,000 one-device claims (kube-scheduler scheduler_perf shape)
  match         the same fleet, 2,500 claims of 2 requests tied by ``matchAttribute`` (5,000 devices)
  mig           A100 nodes with dynamic MIG partitions (from shared/fixtures/real-slices.json), filled with a
                mix of 1g.10gb / 2g.20gb / 3g.40gb claims until nothing fits
  shared        consumable capacity: multi-allocatable 80Gi devices shared by 10Gi claims until full
  unsat-131730  kubernetes#131730: 32 interchangeable devices in two attribute groups of 16, two requests of 9
                with ``matchAttribute`` on the group: unsatisfiable (upstream 1.35 runs for over a minute)
  unsat-131730-search  the same, written so that the up-front constraint bound does not apply and the search
                itself has to prove it (symmetry pruning)

Goals: fill >= 5,000 claims/s, match >= 2,500 claims/s, mig >= 1,000 claims/s, unsat < 100 ms per claim.

    python benchmarks/engine_bench.py [--shape NAME] [--nodes N] [--json]
    python benchmarks/engine_bench.py --vs REV [--runs 3] [--shape NAME]

``--vs REV`` compares this tree's ``dra`` with REV's: a git worktree of REV in a temporary directory (removed
after), the same benchmark code and interpreter run against each tree in turn (``PYTHONPATH``), alternating,
``--runs`` times each (default shapes: fill, match, mig). Figures are CPU-time rates (``time.process_time``),
each printed with the 1-minute load average when its run ended; the ratio is of the medians (ours/theirs).
Targets (issue 32): fill, match and mig >= 1.0x REV; fill >= 16,700 claims/cpu-s (the upstream Go
allocator's rate on the fill shape); the first claim of a shape <= 20 ms CPU (fill) and <= 50 ms (mig).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# --vs runs this script against another tree's ``dra``: DRA_BENCH_TREE names it (else: this checkout).
TREE = os.environ.get("DRA_BENCH_TREE") or os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, TREE)

import dra  # noqa: E402
from dra.cel import compile_expression  # noqa: E402
from dra.engine import ClaimGroup, ClusterInventory, Engine, FleetSnapshot  # noqa: E402

DRIVER = "gpu.example.com"
SHARED = os.environ.get("DRA_SHARED_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", "shared"))


def device_class(name: str, expr: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]}}


def claim(name: str, requests: list[dict], constraints: list[dict] | None = None) -> dict:
    devices: dict = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"}, "spec": {"devices": devices}}


def exact(name: str, cls: str, count: int = 1, selectors: list[str] | None = None, capacity: dict | None = None):
    req = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selectors:
        req["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if capacity:
        req["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": req}


def gpu_fleet(nodes: int, per_node: int, **extra) -> FleetSnapshot:
    slices, node_list = [], []
    for n in range(nodes):
        node = f"node-{n:04d}"
        node_list.append({"name": node, "labels": {"kubernetes.io/hostname": node}})
        devices = []
        for i in range(per_node):
            dev = {"name": f"gpu-{i}", "attributes": {
                "model": {"string": "A100"}, "numa": {"int": i // 2},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i * 2 // per_node:02x}"},
                "index": {"int": i}},
                "capacity": {"memory": {"value": "80Gi"}}}
            dev.update(copy.deepcopy(extra))
            devices.append(dev)
        slices.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": {"name": f"{node}-{DRIVER}"},
                       "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}})
    inv = ClusterInventory(name="bench", nodes=node_list, resource_slices=slices)
    return FleetSnapshot(clusters=[inv], device_classes=[device_class("gpu", f'device.driver == "{DRIVER}"')])


def run(engine: Engine, groups: list[ClaimGroup], claims_per_group: int = 1):
    latencies, ok, first_cpu = [], 0, 0.0
    start, cpu_start = time.perf_counter(), time.process_time()
    for g in groups:
        t0 = time.perf_counter()
        out = engine.allocate(g)
        latencies.append(time.perf_counter() - t0)
        if len(latencies) == 1:
            first_cpu = time.process_time() - cpu_start
        ok += out.allocated
    total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"groups": len(groups), "claims": len(groups) * claims_per_group, "allocated_groups": ok,
            "seconds": round(total, 3), "claims_per_s": round(len(groups) * claims_per_group / total, 1),
            # On a shared machine wall-clock rates include other processes' time slices; CPU time does not.
            "claims_per_cpu_s": round(len(groups) * claims_per_group / max(cpu, 1e-9), 1),
            "first_ms": round(latencies[0] * 1000, 3), "first_cpu_ms": round(first_cpu * 1000, 3),
            "p50_ms": round(statistics.median(latencies) * 1000, 3),
            "p99_ms": round(sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1000, 3),
            "max_ms": round(max(latencies) * 1000, 3)}


def shape_fill(nodes: int):
    snap = gpu_fleet(nodes, 10)
    t0 = time.perf_counter()
    engine = Engine(snap, [])
    build = time.perf_counter() - t0
    groups = [ClaimGroup([claim(f"c{i}", [exact("gpu", "gpu")])], key=f"c{i}") for i in range(nodes * 10)]
    res = run(engine, groups)
    res["build_s"] = round(build, 3)
    res["goal_claims_per_s"] = 5000
    return res


def shape_match(nodes: int):
    engine = Engine(gpu_fleet(nodes, 10), [])
    groups = [ClaimGroup([claim(f"c{i}", [exact("a", "gpu"), exact("b", "gpu")],
                                [{"matchAttribute": f"{DRIVER}/numa", "requests": ["a", "b"]}])], key=f"c{i}")
              for i in range(nodes * 5)]
    res = run(engine, groups)
    res["goal_claims_per_s"] = 2500
    return res


def mig_fleet(nodes: int) -> FleetSnapshot:
    with open(os.path.join(SHARED, "fixtures", "real-slices.json")) as fh:
        fixture = json.load(fh)
    a100 = [s for s in fixture if s["spec"]["pool"]["name"] == "a100-dgx-node-01"]
    slices, node_list = [], []
    for n in range(nodes):
        node = f"a100-{n:03d}"
        node_list.append({"name": node, "labels": {"nvidia.com/gpu.product": "A100-SXM4-80GB"}})
        for s in a100:
            s = copy.deepcopy(s)
            s["metadata"]["name"] = s["metadata"]["name"].replace("a100-dgx-node-01", node)
            s["spec"]["nodeName"] = node
            s["spec"]["pool"]["name"] = node
            slices.append(s)
    inv = ClusterInventory(name="mig", nodes=node_list, resource_slices=slices)
    return FleetSnapshot(clusters=[inv], device_classes=[
        device_class("mig.nvidia.com", 'device.driver == "gpu.nvidia.com" && '
                                       'device.attributes["gpu.nvidia.com"].type == "mig"')])


def shape_mig(nodes: int):
    engine = Engine(mig_fleet(nodes), [])
    profiles = ["1g.10gb", "2g.20gb", "1g.10gb", "3g.40gb"]
    groups = []
    # Per GPU, 1g+2g+1g+3g = 7 slices: the mix fills every GPU exactly; 2 rounds per GPU x 8 GPUs per node.
    for i in range(nodes * 8 * 4):
        p = profiles[i % len(profiles)]
        groups.append(ClaimGroup([claim(f"m{i}", [exact("mig", "mig.nvidia.com", selectors=[
            f'device.attributes["gpu.nvidia.com"].profile == "{p}"'])])], key=f"m{i}"))
    res = run(engine, groups)
    res["goal_claims_per_s"] = 1000
    return res


def shape_shared(nodes: int):
    extra = {"allowMultipleAllocations": True,
             "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                 "default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}}
    engine = Engine(gpu_fleet(nodes, 8, **extra), [])
    groups = [ClaimGroup([claim(f"s{i}", [exact("gpu", "gpu", capacity={"memory": "10Gi"})])], key=f"s{i}")
              for i in range(nodes * 8 * 8)]
    return run(engine, groups)


def unsat_engine() -> Engine:
    devices = [{"name": f"dev-{i}", "attributes": {"group": {"string": "a" if i < 16 else "b"}}} for i in range(32)]
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
               "spec": {"driver": DRIVER, "nodeName": "node-0", "devices": devices,
                        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}}]
    inv = ClusterInventory(name="u", nodes=[{"name": "node-0", "labels": {}}], resource_slices=slices)
    return Engine(FleetSnapshot([inv], [device_class("gpu", f'device.driver == "{DRIVER}"')]), [])


def shape_unsat(first_available: bool):
    """Each claim on a fresh engine, so no memo of an earlier failure helps. With ``first_available`` the first
    request is a one-entry ``firstAvailable`` list, which the up-front constraint bound does not cover: the
    exhaustive search itself must stay small (symmetry and count bounds)."""
    if first_available:
        r0 = {"name": "r0", "firstAvailable": [{"name": "only", "deviceClassName": "gpu",
                                               "allocationMode": "ExactCount", "count": 9}]}
    else:
        r0 = exact("r0", "gpu", 9)
    latencies, ok, steps = [], 0, 0
    cpu = 0.0
    for i in range(50):
        engine = unsat_engine()
        g = ClaimGroup([claim(f"u{i}", [r0, exact("r1", "gpu", 9)], [{"matchAttribute": f"{DRIVER}/group"}])])
        t0, c0 = time.perf_counter(), time.process_time()
        out = engine.allocate(g)
        latencies.append(time.perf_counter() - t0)
        cpu += time.process_time() - c0
        ok += out.allocated
        steps = out.diagnostics.get("search", {}).get("steps", 0)
    total = sum(latencies)
    return {"groups": 50, "claims": 50, "allocated_groups": ok, "seconds": round(total, 3),
            "claims_per_s": round(50 / total, 1), "claims_per_cpu_s": round(50 / max(cpu, 1e-9), 1),
            "first_ms": round(latencies[0] * 1000, 3),
            "p50_ms": round(statistics.median(latencies) * 1000, 3),
            "p99_ms": round(sorted(latencies)[48] * 1000, 3), "max_ms": round(max(latencies) * 1000, 3),
            "search_steps": steps, "goal_max_ms": 100}


SHAPES = {"fill": shape_fill, "match": shape_match, "mig": shape_mig, "shared": shape_shared,
          "unsat-131730": lambda nodes: shape_unsat(False),
          "unsat-131730-search": lambda nodes: shape_unsat(True)}


VS_SHAPES = ("fill", "match", "mig")
RATIO_TARGET = 1.0  # of REV's rate, for each of VS_SHAPES
FILL_TARGET = 16_700  # claims per CPU second: the upstream Go allocator on the fill shape
FIRST_TARGET_MS = {"fill": 20.0, "mig": 50.0}  # CPU of the first claim of a shape (index builds included)


def bench_tree(tree: str, shapes: list[str], nodes: int | None) -> dict:
    """One run of this script against ``tree``'s ``dra`` in a fresh interpreter (the same one)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--json"] + [a for s in shapes for a in ("--shape", s)]
    if nodes:
        cmd += ["--nodes", str(nodes)]
    env = dict(os.environ, PYTHONPATH=tree, DRA_BENCH_TREE=tree, DRA_SHARED_DIR=SHARED)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    results = json.loads(out)
    for r in results.values():  # the run measured the tree it was meant to
        assert r["dra"].startswith(os.path.realpath(tree) + os.sep), (r["dra"], tree)
    return results


def median(runs: list[dict], shape: str, field: str) -> float:
    return statistics.median(r[shape][field] for r in runs)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def vs_report(rev: str, ours: list[dict], theirs: list[dict], shapes: list[str]) -> list[str]:
    def figures(runs, shape, field="claims_per_cpu_s"):
        return " ".join(f"{r[shape][field]:.0f}@{r[shape]['load']:.1f}" for r in runs)

    lines = [f"engine_bench --vs {rev}: claims per CPU second, each run as rate@load (1-min load average); "
             f"ratio of medians, ours/theirs; {len(ours)} runs each, alternating"]
    for shape in shapes:
        mine, base = median(ours, shape, "claims_per_cpu_s"), median(theirs, shape, "claims_per_cpu_s")
        ratio = mine / base if base else float("inf")
        first, first_base = median(ours, shape, "first_cpu_ms"), median(theirs, shape, "first_cpu_ms")
        lines.append(f"{shape:8s} ours {figures(ours, shape):32s} theirs {figures(theirs, shape):32s} "
                     f"ratio {ratio:.2f}x  first claim CPU ours {first:.1f} ms, theirs {first_base:.1f} ms")
        targets = []
        if shape in VS_SHAPES:
            targets.append(f">= {RATIO_TARGET:.1f}x {rev}: {verdict(ratio >= RATIO_TARGET)}")
        if shape == "fill":
            targets.append(f">= {FILL_TARGET} claims/cpu-s: {verdict(mine >= FILL_TARGET)}")
        if shape in FIRST_TARGET_MS:
            targets.append(f"first claim <= {FIRST_TARGET_MS[shape]:.0f} ms CPU: "
                           f"{verdict(first <= FIRST_TARGET_MS[shape])}")
        if targets:
            lines.append(f"{'':8s} " + "; ".join(targets))
    return lines


def run_vs(rev: str, shapes: list[str], nodes: int | None, runs: int) -> list[str]:
    """Bench this checkout against a temporary git worktree of ``rev``, alternating (ours first on even rounds,
    theirs first on odd ones, so a drift in load falls on both)."""
    here = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    top = subprocess.run(["git", "-C", here, "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                         text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="engine-bench-vs-")
    tree = os.path.join(tmp, "tree")
    subprocess.run(["git", "-C", top, "worktree", "add", "--detach", tree, rev], check=True, capture_output=True)
    ours: list[dict] = []
    theirs: list[dict] = []
    try:
        for i in range(runs):
            order = [(here, ours), (tree, theirs)]
            for path, sink in order if i % 2 == 0 else order[::-1]:
                sink.append(bench_tree(path, shapes, nodes))
    finally:
        subprocess.run(["git", "-C", top, "worktree", "remove", "--force", tree], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return vs_report(rev, ours, theirs, shapes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append")
    ap.add_argument("--nodes", type=int, default=None, help="fleet size (default: 500; 50 for mig and shared)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--vs", metavar="REV", help="compare with a git revision (see above)")
    ap.add_argument("--runs", type=int, default=3, help="runs per tree with --vs (default: 3)")
    args = ap.parse_args(argv)
    if args.vs:
        print("\n".join(run_vs(args.vs, args.shape or list(VS_SHAPES), args.nodes, args.runs)))
        return 0
    # The CEL parser (a lark LALR table) is built once per process on first use (~0.2 s); that is start-up
    # cost, not per-claim cost, so pay it before measuring. Index building per selector and cluster is not
    # warmed: it is part of the first claim's latency (first_ms).
    compile_expression("true")
    results = {}
    for name in args.shape or list(SHAPES):
        nodes = args.nodes or (50 if name in ("mig", "shared") else 500)
        results[name] = SHAPES[name](nodes)
        results[name]["load"] = round(os.getloadavg()[0], 2)
        results[name]["dra"] = os.path.realpath(os.path.dirname(dra.__file__))
        if not args.json:
            r = results[name]
            print(f"{name:19s} claims={r['claims']:5d} allocated={r['allocated_groups']:5d} "
                  f"{r['claims_per_s']:8.1f} claims/s ({r['claims_per_cpu_s']:8.1f}/cpu-s) "
                  f"p50={r['p50_ms']:.3f}ms p99={r['p99_ms']:.3f}ms "
                  f"max={r['max_ms']:.3f}ms first={r['first_ms']:.3f}ms")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
