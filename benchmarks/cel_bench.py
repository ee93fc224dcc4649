"""Fleet-scale benchmark of dra.cel (a developer tool: it reads ../shared at run time).

Builds 40,000 devices from the real ResourceSlice fixture shapes (the 248 fixture devices
replicated over synthetic nodes; each copy gets its own uuid and PCI bus ID, as real nodes with
the same GPU model do) and evaluates the 59 real-world selectors of fixtures/real-cel.json.

Figures printed:
  stock      cel-python's own InterpretedRunner (no DRA library, device value prebuilt), on
             a sample of selectors it can run: the baseline the issue quotes (~650 us);
  naive      dra.cel with neither memo nor index: one evaluation per (selector, device),
             device values built on first use, measured on a sample and extrapolated;
  first pass a fresh SelectorCache over the whole fleet (device views, projections, the
             distinct evaluations, memo fills);
  second     the same selectors over the unchanged fleet (same device objects);
  reloaded   the unchanged fleet re-read as new CELDevice objects (fingerprints recomputed);
and each with and without the driver index.

Times are process CPU seconds (time.process_time), which other load on a shared machine
disturbs far less than wall-clock time.

Run: .venv/bin/python benchmarks/cel_bench.py [--devices N] [--sample N]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import contextlib

from dra.cel import CELCompileError, CELDevice, CELRuntimeError, SelectorCache, compile_expression  # noqa: E402
from dra.cel.cache import reset_shared_caches  # noqa: E402

SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures"))
_UNIQUE = ("uuid", "parentUUID", "resource.kubernetes.io/pciBusID", "pciAddr", "pciAddress", "deviceID", "pciId")


def fixture_devices() -> list[tuple[str, dict]]:
    with open(os.path.join(SHARED, "real-slices.json")) as f:
        slices = json.load(f)
    out = []
    for s in slices:
        spec = s["spec"]
        for d in spec.get("devices") or []:
            out.append((spec["driver"], d))
    return out


def build_fleet(n: int) -> list[CELDevice]:
    shapes = fixture_devices()
    fleet = []
    copy = 0
    while len(fleet) < n:
        for driver, d in shapes:
            attrs = dict(d.get("attributes") or {})
            for name in _UNIQUE:
                if name in attrs and "string" in attrs[name]:
                    attrs[name] = {"string": f"{attrs[name]['string']}-n{copy}"}
            fleet.append(
                CELDevice(driver=driver, attributes=attrs, capacity=dict(d.get("capacity") or {}),
                          allow_multiple_allocations=d.get("allowMultipleAllocations"))
            )
            if len(fleet) == n:
                break
        copy += 1
    return fleet


def selectors() -> list[str]:
    with open(os.path.join(SHARED, "real-cel.json")) as f:
        return [e["expression"] for e in json.load(f)]


def stock_celpy_us(exprs, fleet, rng) -> float | None:
    """Per-evaluation cost of plain cel-python on the selectors it can run unaided (no
    quantity/semver/bind), against a device value built once: the issue's baseline."""
    import celpy

    env = celpy.Environment()
    plain = [e for e in exprs if not any(f in e for f in ("quantity", "semver", "cel.bind", "lowerAscii"))]
    programs = [env.program(env.compile(e)) for e in plain]
    devices = [d for d in rng.sample(fleet, 200)]
    activations = [{"device": d.view().value} for d in devices]
    n = 0
    start = time.process_time()
    for program in programs:
        for act in activations[:40]:
            with contextlib.suppress(Exception):  # stock cel-python raises assorted errors here
                program.evaluate(act)
            n += 1
    return (time.process_time() - start) / n * 1e6 if n else None


def run_pass(cache: SelectorCache, exprs, fleet, use_index: bool) -> tuple[float, int, int, int]:
    matches = errors = evaluated_pairs = 0
    start = time.process_time()
    for expr in exprs:
        for result in cache.evaluate_many(expr, fleet, use_driver_index=use_index):
            if result is True:
                matches += 1
            elif isinstance(result, CELRuntimeError):
                errors += 1
    elapsed = time.process_time() - start
    evaluated_pairs = len(exprs) * len(fleet)
    return elapsed, matches, errors, evaluated_pairs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=40_000)
    parser.add_argument("--sample", type=int, default=3_000, help="naive evaluations to time")
    args = parser.parse_args()

    t = time.process_time()
    fleet = build_fleet(args.devices)
    build_s = time.process_time() - t
    exprs_all = selectors()
    exprs = []
    for e in exprs_all:
        try:
            compile_expression(e)
            exprs.append(e)
        except CELCompileError:
            pass
    pairs = len(exprs) * len(fleet)
    print(f"fleet: {len(fleet)} devices from {len(fixture_devices())} fixture shapes (built in {build_s:.2f} s)")
    print(f"selectors: {len(exprs_all)} in real-cel.json, {len(exprs)} compile "
          "(the rest are rejected as upstream 1.35 does)")
    print(f"pairs per pass: {pairs:,}")

    rng = random.Random(7)
    stock_us = stock_celpy_us(exprs, fleet, rng)
    if stock_us is not None:
        print(f"\nstock cel-python InterpretedRunner: {stock_us:.0f} us per evaluation -> "
              f"{stock_us * pairs / 1e6:.0f} s for the fleet (extrapolated)")
    sample = [(rng.choice(exprs), rng.choice(fleet)) for _ in range(args.sample)]
    compiled = {e: compile_expression(e) for e in exprs}

    def timed() -> float:
        t = time.process_time()
        for e, d in sample:
            with contextlib.suppress(CELRuntimeError):
                compiled[e].evaluate(d)
        return (time.process_time() - t) / len(sample)

    cold = timed()  # first touch of each device builds its fingerprint and CEL value
    warm = timed()
    naive = warm * pairs
    print(f"\ndra.cel evaluation without memo or index: {warm * 1e6:.0f} us per evaluation with the device value "
          f"already built ({cold * 1e6:.0f} us on first touch of a device) -> naive fleet pass {naive:.0f} s "
          f"(extrapolated from {len(sample)} random pairs)")

    for use_index in (False, True):
        label = "with driver index" if use_index else "without driver index"
        # Cold start for each mode: new device objects, no shared views or projections.
        reset_shared_caches()
        fleet = build_fleet(args.devices)
        cache = SelectorCache()
        first, m1, e1, _ = run_pass(cache, exprs, fleet, use_index)
        stats1 = cache.stats()
        second, m2, e2, _ = run_pass(cache, exprs, fleet, use_index)
        reloaded_fleet = build_fleet(args.devices)
        reloaded, m3, e3, _ = run_pass(cache, exprs, reloaded_fleet, use_index)
        stats = cache.stats()
        assert (m1, e1) == (m2, e2) == (m3, e3), "memoised results differ from first pass"
        print(f"\n{label}:")
        print(f"  first pass : {first:7.2f} s  ({first / pairs * 1e6:.2f} us/pair; {stats1['evaluations']} real "
              f"evaluations; {m1:,} matches, {e1:,} errors)")
        print(f"  second pass: {second:7.2f} s  ({second / pairs * 1e6:.2f} us/pair) = {second / first:.1%} "
              f"of first pass, {second / naive:.3%} of naive")
        print(f"  reloaded   : {reloaded:7.2f} s  ({reloaded / pairs * 1e6:.2f} us/pair) = {reloaded / first:.1%} "
              f"of first pass (same content, new objects)")
        print(f"  first pass vs naive: {first / naive:.2%}; memo entries {stats['entries']}, "
              f"evaluations {stats['evaluations']}")


if __name__ == "__main__":
    main()
