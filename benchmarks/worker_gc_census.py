"""What a worker's full garbage collections scan: the worker's allocation path in one process, then a census.

Runs against the soak benchmark's database after ``soak_bench.py`` (its fleet of 40,000 devices and its claims):

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice_soak_bench \\
        .venv/bin/python benchmarks/worker_gc_census.py [--rounds 300] [--per-round 10] [--max-age 20]

Each round creates ``--per-round`` claims with selector texts of their own (the soak's churn, ``_soak.claim``),
runs ``allocation.allocate_round`` as the worker does (the process's long-lived engine cache, frozen by the
worker's collector policy) and releases the claims it created ``--live`` rounds earlier. ``--max-age`` shortens
the fleet view's backstop rebuild (``fleet.SNAPSHOT_MAX_AGE_SECONDS``, 60 s in the service) so that a short run
sees some. Prints the collections per generation (count, longest CPU ms), then the objects the collector still
sees by type (the largest first), what a full collection costs now, and the process's RSS. Diagnostic only:
it prints no goal lines.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
os.environ["CELERY_BROKER_URL"] = ""


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def census(top: int) -> tuple[int, list[tuple[str, int]]]:
    objects = gc.get_objects()
    counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    del objects
    return sum(counts.values()), counts.most_common(top)


def probe(names: list[str], sample: int = 300) -> None:
    """For each type named: the types of the objects holding a sample of its instances (two levels up)."""
    objects = gc.get_objects()
    for name in names:
        mine = [o for o in objects if f"{type(o).__module__}.{type(o).__qualname__}" == name][::97][:sample]
        held: Counter = Counter()
        for o in mine:
            for r in gc.get_referrers(o):
                if r is objects or r is mine:
                    continue
                up = [type(rr).__qualname__ for rr in gc.get_referrers(r) if rr is not objects and rr is not mine][:2]
                held[f"{type(r).__qualname__} <- {','.join(up)}"] += 1
        print(f"  {name}: held by {held.most_common(6)}")
        if os.environ.get("CENSUS_DEBUG") and mine:
            o, seen = mine[0], {id(objects), id(mine)}
            for depth in range(7):
                refs = [r for r in gc.get_referrers(o) if id(r) not in seen and not isinstance(r, types.FrameType)]
                if not refs:
                    break
                seen.add(id(o))
                o = refs[0]
                text = repr(list(o.keys())[:6]) if isinstance(o, dict) else repr(o)[:120]
                print(f"    {depth}: {type(o).__qualname__} {text}")
    del objects


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--live", type=int, default=50, help="rounds a claim is held before its release")
    parser.add_argument("--max-age", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--texts", type=int, default=0, help="distinct selector texts, reused in turn (0: all new)")
    parser.add_argument("--trace", type=int, default=0, help="print the frozen count every N rounds")
    parser.add_argument("--probe", action="store_true", help="also: who holds a sample of the commonest types")
    args = parser.parse_args()

    import django

    django.setup()
    from benchmarks._soak import SHAPES, claim
    from claims import dispatch
    from claims.models import ResourceClaim
    from claims.services import claims as claim_services
    from claims.services import fleet
    from scheduler.services import allocation

    dispatch.request_allocation = lambda: None  # the loop below runs the rounds, as the worker would
    fleet.SNAPSHOT_MAX_AGE_SECONDS = args.max_age
    by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            by_gen[info["generation"]].append((time.thread_time() - started[0]) * 1e3)

    from benchmarks._soak import selector_text

    # Warm up as a worker that has run a while: one claim, one round (builds and freezes the engine).
    claim_services.create_claims("team-0", [claim(f"gcc{os.getpid()}-warm", SHAPES[0], 0)])
    allocation.allocate_round()
    assert selector_text
    gc.callbacks.append(timer)
    held: list[list[int]] = []
    tag = f"gcc{os.getpid()}"
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    rss_first = 0.0
    for r in range(args.rounds):
        made = []
        for i in range(args.per_round):
            shape = SHAPES[(r + i) % len(SHAPES)]
            text = r * args.per_round + i
            body = claim(f"{tag}-{r}-{i}", shape, 50_000 + (text % args.texts if args.texts else text))
            made += [c.pk for c in claim_services.create_claims(f"team-{i % 4}", [body])]
        allocation.allocate_round()
        held.append(made)
        if len(held) > args.live:
            for pk in held.pop(0):
                claim_services.release_claim(pk)
        if r == args.rounds // 4:
            rss_first = rss_mb()
        if args.trace and r % args.trace == 0:
            print(f"  round {r}: frozen {gc.get_freeze_count():,}, unfrozen {len(gc.get_objects()):,}, "
                  f"RSS {rss_mb():.0f} MB", flush=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    gc.callbacks.remove(timer)
    for batch in held:
        for pk in batch:
            claim_services.release_claim(pk)
    allocated = ResourceClaim.objects.filter(name__startswith=tag, allocation__isnull=False).count()
    print(f"{args.rounds} rounds x {args.per_round} claims in {wall:.1f} s wall, {cpu:.1f} s CPU; "
          f"{allocated} of them still allocated after the final releases (expected 0)")
    for g, p in by_gen.items():
        print(f"  generation {g}: {len(p)} collections, longest {max(p, default=0):.1f} ms CPU, "
              f"total {sum(p):.0f} ms")
    total, top = census(args.top)
    print(f"objects the collector sees: {total:,} (thresholds {gc.get_threshold()}, frozen {gc.get_freeze_count():,})")
    for name, n in top:
        print(f"  {n:>9,}  {name}")
    if args.probe:
        probe([name for name, _ in top[:6]])
    c0 = time.thread_time()
    gc.collect()
    print(f"a full collection now: {(time.thread_time() - c0) * 1e3:.1f} ms CPU; RSS {rss_first:.0f} MB after a "
          f"quarter of the rounds, {rss_mb():.0f} MB at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
