"""Selector churn: does a plain claim get slower, or the worker bigger, as distinct CEL selectors pile up?

CI pipelines write selectors with commit ids, product names and versions, so a long-running worker sees an
endless stream of distinct selector texts. This drives one engine (one worker's view) with that stream:

1. a fleet of NODES x 8 GPUs (default 1,250 nodes = 10,000 devices);
2. phases of CHURN distinct selectors each (default 500), every one used by one 1-GPU claim that is then
   released (so the fleet stays free and only the selector count grows);
3. after each phase: the cost of a plain 1-GPU claim (allocate + release, median of 300), the engine's
   selector state (selector sets, key indexes) and the process RSS.

Goals: a plain claim after 3,000 distinct selectors costs at most 2x what it cost after none; RSS is flat once
the bounded caches are full (less than 5 % growth over the last two phases). The caches' worst case is about
1,024 selector sets, 512 key indexes and 2,048 compiled programs (~40 KB each): ~200 MB on this fleet.

    python benchmarks/selector_churn_bench.py [--nodes N] [--churn K] [--phases P] [--check]
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.engine_bench import claim, exact, gpu_fleet  # noqa: E402
from dra.engine import ClaimGroup, Engine  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def cycle(engine: Engine, name: str, selectors: list[str] | None) -> float:
    """Allocate one 1-GPU claim and release it; returns the seconds the allocation took."""
    group = ClaimGroup(key=name, claims=[claim(name, [exact("gpu", "gpu", 1, selectors)])])
    started = time.perf_counter()
    outcome = engine.allocate(group)
    took = time.perf_counter() - started
    if not outcome.allocated:
        raise SystemExit(f"{name}: not allocated: {outcome.message}")
    engine.release(outcome.devices)
    return took


def plain_cost_us(engine: Engine, samples: int = 300) -> float:
    return statistics.median(cycle(engine, f"plain-{i}", None) for i in range(samples)) * 1e6


def selector_state(engine: Engine) -> str:
    stats = getattr(engine, "selector_stats", None)
    if stats is None:
        return f"selector sets {len(engine._selector_sets)}, key indexes {len(engine._key_index)}"
    s = stats()
    return f"selector sets {s['selector_sets']}, key indexes {s['key_indexes']}, evicted {s['evicted']}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--churn", type=int, default=500)
    parser.add_argument("--phases", type=int, default=6)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    engine = Engine(gpu_fleet(args.nodes, 8))
    gc.collect()
    base_rss = rss_mb()
    base_cost = plain_cost_us(engine)
    print(f"fleet: {args.nodes * 8} devices; selectors seen 0: plain claim {base_cost:8.1f} µs, "
          f"RSS {base_rss:6.1f} MB, {selector_state(engine)}")
    seen = 0
    cost = base_cost
    rss_by_phase = [base_rss]
    for _ in range(args.phases):
        for i in range(seen, seen + args.churn):
            # A different text each time (as a pipeline's commit id makes it), selecting every GPU.
            cycle(engine, f"churn-{i}", [f'device.attributes["gpu.example.com"].index >= 0 && "{i:08x}" != "x"'])
        seen += args.churn
        cost = plain_cost_us(engine)
        rss_by_phase.append(rss_mb())
        print(f"selectors seen {seen:5d}: plain claim {cost:8.1f} µs, RSS {rss_mb():6.1f} MB, "
              f"{selector_state(engine)}")
    late = rss_by_phase[-3] if len(rss_by_phase) >= 3 else base_rss
    growth = (rss_by_phase[-1] - late) / late * 100
    goals = [(cost <= 2 * base_cost, f"plain claim after {seen} selectors {cost:.1f} µs <= 2x {base_cost:.1f} µs"),
             (growth < 5, f"RSS over the last two phases {late:.0f} -> {rss_by_phase[-1]:.0f} MB "
                          f"({growth:+.1f} %) < +5 % (total {rss_by_phase[-1] - base_rss:+.0f} MB)")]
    for ok, text in goals:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    return 1 if args.check and not all(ok for ok, _ in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
