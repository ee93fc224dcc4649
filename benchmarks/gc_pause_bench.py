"""Garbage-collection pauses of a worker's engine: 40,000 devices, then a stream of allocations and releases.

Runs the same trace twice in fresh interpreters: with the interpreter's defaults, and with the worker's policy
(``dra.engine.memory``: rarer young collections, the engine frozen out of the collector's sight once built).
Prints the longest pause and the total time in the collector per run. Goal: no pause > 50 ms with the policy.

    python benchmarks/gc_pause_bench.py [--nodes 5000] [--claims 20000] [--check]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def run(nodes: int, claims: int, policy: bool) -> dict:
    sys.path.insert(0, ROOT)
    import gc

    from benchmarks.engine_bench import claim, exact, gpu_fleet
    from dra.engine import ClaimGroup, Engine, memory

    pauses: list[float] = []
    started = [0.0]

    def timer(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started[0])

    snapshot = gpu_fleet(nodes, 8)
    engine = Engine(snapshot)
    if policy:
        memory.freeze_long_lived()
    gc.callbacks.append(timer)
    held = []
    t0 = time.perf_counter()
    for i in range(claims):
        sel = None if i % 3 else [f'device.attributes["gpu.example.com"].numa == {i % 4}']
        out = engine.allocate(ClaimGroup(key=f"c{i}", claims=[claim(f"c{i}", [exact("gpu", "gpu", 1 + i % 2, sel)])]))
        if out.allocated:
            held.append(out.devices)
        if len(held) > nodes * 6:  # keep the fleet ~70 % full
            engine.release(held.pop(0))
    wall = time.perf_counter() - t0
    gc.callbacks.remove(timer)
    return {"policy": policy, "devices": nodes * 8, "claims": claims, "collections": len(pauses),
            "max_pause_ms": round(max(pauses, default=0) * 1e3, 1), "gc_total_s": round(sum(pauses), 2),
            "wall_s": round(wall, 2)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=20000)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--child", choices=["default", "policy"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.nodes, args.claims, args.child == "policy")))
        return 0
    results = {}
    for mode in ("default", "policy"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--nodes", str(args.nodes),
                              "--claims", str(args.claims)], capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[mode]
        print(f"{mode:8s} {r['devices']} devices, {r['claims']} claims: {r['collections']} collections, "
              f"max pause {r['max_pause_ms']} ms, {r['gc_total_s']} s in the collector of {r['wall_s']} s")
    ok = results["policy"]["max_pause_ms"] <= 50
    print(f"  {'met   ' if ok else 'MISSED'} no GC pause > 50 ms with the worker's policy "
          f"({results['policy']['max_pause_ms']} ms; defaults {results['default']['max_pause_ms']} ms)")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
