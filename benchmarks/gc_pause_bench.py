"""Garbage-collection pauses of a worker's engine: 40,000 devices, then a stream of allocations and releases.

Runs the same trace twice in fresh interpreters: with the interpreter's defaults, and with the worker's policy
(``dra.engine.memory``: rarer young collections, the engine frozen out of the collector's sight once built, what
each round of ``--per-round`` claims leaves alive frozen after it).
Prints the longest pause and the total time in the collector per run. Goal: no pause > 50 ms with the policy.

With ``--texts`` every so many claims carries a selector text of its own (a commit id in an always-true clause,
as the soak's churn): compiled programs, plans, selector sets and their indexes are made and evicted all the
time, in the objects the collector still sees. The full (generation 2) collections they cause are counted apart.

    python benchmarks/gc_pause_bench.py [--nodes 5000] [--claims 20000] [--texts 2] [--per-round 10] [--check]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def run(nodes: int, claims: int, policy: bool, texts: int = 0, per_round: int = 10) -> dict:
    sys.path.insert(0, ROOT)
    import gc

    from benchmarks.engine_bench import claim, exact, gpu_fleet
    from dra.engine import ClaimGroup, Engine, memory

    pauses: list[float] = []
    cpu_pauses: list[float] = []  # the same in CPU time: on a loaded machine wall pauses include waiting for a core
    by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}  # CPU pauses per generation collected
    started = [0.0, 0.0]

    def timer(phase, info):
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
        else:
            pauses.append(time.perf_counter() - started[0])
            cpu_pauses.append(time.thread_time() - started[1])
            by_gen[info["generation"]].append(cpu_pauses[-1])

    snapshot = gpu_fleet(nodes, 8)
    if policy:  # as claims.services.engines does it for the worker
        memory.release_frozen()
        with memory.collector_paused():
            engine = Engine(snapshot)
        memory.freeze_long_lived(engine)
    else:
        engine = Engine(snapshot)
    gc.callbacks.append(timer)
    held = []
    t0 = time.perf_counter()
    for i in range(claims):
        sel = None if i % 3 else [f'device.attributes["gpu.example.com"].numa == {i % 4}']
        if texts and i % texts == 0:
            sel = [f'device.attributes["gpu.example.com"].numa == {i % 4} && "commit-{i:08x}" != ""']
        out = engine.allocate(ClaimGroup(key=f"c{i}", claims=[claim(f"c{i}", [exact("gpu", "gpu", 1 + i % 2, sel)])]))
        if out.allocated:
            held.append(out.devices)
        if len(held) > nodes * 6:  # keep the fleet ~70 % full
            engine.release(held.pop(0))
        if policy and i % per_round == per_round - 1:
            memory.settle()  # the end of a worker's round (scheduler.services.allocation)
    wall = time.perf_counter() - t0
    gc.callbacks.remove(timer)
    # What a full collection costs now: the pause the next one would take (frozen objects are not scanned).
    unfrozen = len(gc.get_objects())
    started_cpu = time.thread_time()
    gc.collect()
    full_now_ms = (time.thread_time() - started_cpu) * 1e3
    return {"policy": policy, "devices": nodes * 8, "claims": claims, "texts": texts, "collections": len(pauses),
            "max_pause_ms": round(max(pauses, default=0) * 1e3, 1), "gc_total_s": round(sum(pauses), 2),
            "max_cpu_pause_ms": round(max(cpu_pauses, default=0) * 1e3, 1),
            "by_generation": {g: [len(p), round(max(p, default=0) * 1e3, 1)] for g, p in by_gen.items()},
            "full": len(by_gen[2]), "unfrozen": unfrozen, "full_now_ms": round(full_now_ms, 1),
            "wall_s": round(wall, 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=20000)
    parser.add_argument("--texts", type=int, default=0, help="every N-th claim has a new selector text (0: none)")
    parser.add_argument("--per-round", type=int, default=10, help="claims per round (settled after each)")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--child", choices=["default", "policy"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.nodes, args.claims, args.child == "policy", args.texts, args.per_round)))
        return 0
    results = {}
    for mode in ("default", "policy"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--nodes", str(args.nodes),
                              "--claims", str(args.claims), "--texts", str(args.texts),
                              "--per-round", str(args.per_round)],
                             capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[mode]
        print(f"{mode:8s} {r['devices']} devices, {r['claims']} claims (new text every {r['texts'] or '-'}): "
              f"{r['collections']} collections, max pause {r['max_pause_ms']} ms (CPU {r['max_cpu_pause_ms']} ms), "
              f"{r['gc_total_s']} s in the collector of {r['wall_s']} s; per generation [collections, max CPU ms] "
              f"{r['by_generation']}; then {r['unfrozen']:,} objects in the collector's sight, a full collection "
              f"{r['full_now_ms']} ms CPU")
    policy = results["policy"]
    goals = [(policy["max_pause_ms"] <= 50,
              f"no GC pause > 50 ms with the worker's policy "
              f"({policy['max_pause_ms']} ms; defaults {results['default']['max_pause_ms']} ms)"),
             (policy["full_now_ms"] <= 50, f"a full collection after the trace <= 50 ms CPU with the worker's policy "
                                           f"({policy['full_now_ms']} ms, {policy['unfrozen']:,} objects unfrozen)")]
    for ok, text in goals:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    return 1 if args.check and not all(ok for ok, _ in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
