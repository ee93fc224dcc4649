"""What an inventory push costs the allocation worker (issue 14): its fleet view and engine brought up to date.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python benchmarks/push_rebuild_bench.py

Its own database ``<DATABASE_URL's name>_push_bench`` with the soak's fleet (BENCH_DEVICES, 40,000 devices in
4 clusters of the demo fleet's real shapes, BENCH_FILL of the 1-device slots in use as allocation rows), in
this one process, with the worker's collector policy (``memory.worker_start``: long-lived objects frozen).
Then, per cluster, a real push through the inventory's sync service that changes one node's labels (so the
cluster's inventory version moves), and the worker's next ``current_view`` + ``engine_for``: wall and CPU
time, and the longest garbage collection during it. For comparison the same step with the whole fleet rebuilt
(what every push cost before: the view and the engine built from scratch, the old engine collected).
``--check`` exits 1 when a one-cluster push costs more than half of a whole-fleet rebuild (CPU).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._live import bench_database, recreate_database  # noqa: E402

BASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
BENCH_DB, DB_URL = bench_database(BASE_URL, "push_bench")
FILL = float(os.environ.get("BENCH_FILL", "0.8"))


class Pauses:
    """The longest collection (wall) while installed."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._start)


def step(pauses: Pauses) -> dict:
    from claims.services import fleet
    from claims.services.engines import engines

    pauses.longest = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    view = fleet.current_view()
    viewed = time.perf_counter()
    engine = engines.engine_for(view, fleet.rows_in_use())
    return {"wall_ms": round(1000 * (time.perf_counter() - wall)), "view_ms": round(1000 * (viewed - wall)),
            "cpu_ms": round(1000 * (time.process_time() - cpu)), "gc_max_ms": round(1000 * pauses.longest),
            "devices": len(engine.devices)}


def fill() -> None:
    """Rounds of the real allocator until none takes a claim (creating claims with no broker already ran
    rounds inline): the claims created are placed, their allocation rows in use."""
    from scheduler.services import allocation

    while allocation.allocate_round().taken:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    os.environ.update(DATABASE_URL=DB_URL, CELERY_BROKER_URL="", LOG_LEVEL="WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
    recreate_database(BASE_URL, BENCH_DB)
    from benchmarks._soak import SHAPES, claim
    from benchmarks.soak_bench import setup_fleet

    _, slots, nodes = setup_fleet()
    from claims.services import claims as claim_services
    from claims.services import fleet
    from claims.services.engines import engines
    from dra.engine import memory
    from inventory import demo
    from inventory.services import sync

    for shape in SHAPES:
        bodies = [claim(f"{shape.name}-{i}", shape, None) for i in range(int(slots[shape.name] * FILL))]
        for at in range(0, len(bodies), 1000):
            claim_services.create_claims(f"fill-{shape.name}", bodies[at:at + 1000])
    fill()
    from claims.models import DeviceAllocation

    print(f"{time.strftime('%H:%M:%S')} {DeviceAllocation.objects.count()} devices in use", flush=True)
    memory.worker_start()
    pauses = Pauses()
    gc.callbacks.append(pauses)
    print(f"first build: {step(pauses)}", flush=True)
    pushes, whole = [], []
    for turn, shape in enumerate(SHAPES):
        slices, node_list = [], []
        for i in range(nodes[shape.name]):
            node = f"{shape.name}-node-{i:05d}"
            slices += demo.node_slices(shape.node_type, node)
            node_list.append({"name": node, "labels": {"kubernetes.io/hostname": node,
                                                       "bench/turn": str(turn) if i == 0 else ""}})
        sync.push_inventory(f"soak-{shape.name}", {"resourceSlices": slices, "nodes": node_list})
        pushes.append(step(pauses))
        print(f"push to soak-{shape.name}: {pushes[-1]}", flush=True)
        fleet.invalidate(hard=True)
        engines.reset()
        whole.append(step(pauses))
        print(f"whole fleet rebuilt (as every push did before): {whole[-1]}", flush=True)
    one = sorted(p["cpu_ms"] for p in pushes)[len(pushes) // 2]
    everything = sorted(p["cpu_ms"] for p in whole)[len(whole) // 2]
    ok = one <= everything / 2
    print(f"  {'met   ' if ok else 'MISSED'} a push to one of {len(SHAPES)} clusters costs the worker at most half a "
          f"whole-fleet rebuild: median {one} ms CPU vs {everything} ms (longest GC pause "
          f"{max(p['gc_max_ms'] for p in pushes)} vs {max(p['gc_max_ms'] for p in whole)} ms)")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
