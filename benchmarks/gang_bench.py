#!/usr/bin/env python
"""Gang placement benchmark: a 64-member gang (8 GPUs each) on a 512-node, 8xH100 fleet.

Fleet: 512 nodes in 2 zones x 16 racks of 16 nodes, racks of 4 blocks of 4 nodes (node labels
``topology.kubernetes.io/zone``, ``topology.draservice.io/rack``, ``topology.draservice.io/block``), the
demo fleet's real H100 GPU slices.

Cases (engine decision: ``dra.gang.GangPlacer.place`` on a long-lived engine, as in the worker):
  zone-64x8        64 x 8 GPUs, required zone, preferred rack (one zone, 4 racks): placed
  zone-64x8-busy   the same on a fleet 40% used by 1-4 GPU claims spread over the nodes: placed where it fits
  rack-17x8        17 x 8 GPUs, required rack (16 nodes): pending, with the closest rack named
  fleet-512x8      512 x 8 GPUs, no topology: the whole fleet (KAI's 512 pods on 512 nodes)
  elastic-200x8    200 members, minMember 128, required zone, on a fleet 10% used: no zone has 200 whole free
                   nodes, so it places as many as fit (at least 128) in the best zone

Each case runs once on a fresh engine ("cold": includes building the engine's per-selector index of the
fleet and the first CEL evaluations) and then ``--repeat`` times on the warm engine without committing
(``commit=False`` leaves the engine as it was), reporting p50/p99. Goal: under 1 s for the engine decision.
For scale: KAI Scheduler's published figure for a 512-pod job on 512 nodes is 48.7 s end to end.

``--e2e`` (needs PostgreSQL: DATABASE_URL) also times the service path in a throw-away database: pushing
the fleet, creating the gang (64 consumers and claims), and the worker's placement transaction that writes
512 allocation rows and 64 claims.

    python benchmarks/gang_bench.py [--repeat 20] [--case NAME] [--e2e] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from dra.engine import ClaimGroup, ClusterInventory, Engine, FleetSnapshot  # noqa: E402
from dra.gang import Gang, GangMember, GangPlacer, Topology  # noqa: E402
from inventory import demo  # noqa: E402

ZONE, RACK, BLOCK = "topology.kubernetes.io/zone", "topology.draservice.io/rack", "topology.draservice.io/block"
LEVELS = (ZONE, RACK, BLOCK)
NODES = 512


def fleet_nodes(n: int = NODES) -> list[dict]:
    out = []
    for i in range(n):
        name = f"gpu-{i:04d}"
        out.append({"name": name, "labels": {"kubernetes.io/hostname": name, ZONE: f"zone-{i // 256}",
                                             RACK: f"rack-{i // 16:02d}", BLOCK: f"block-{i // 4:03d}"}})
    return out


def snapshot(nodes: list[dict]) -> FleetSnapshot:
    slices = [s for n in nodes for s in demo.node_slices("h100", n["name"])
              if s["spec"]["driver"] == "gpu.nvidia.com"]
    return FleetSnapshot([ClusterInventory("bench", nodes=nodes, resource_slices=slices)],
                         demo.standard_device_classes())


def claim(name: str, count: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}}]}}}


def gang(name: str, members: int, gpus: int = 8, min_member: int | None = None, required=None,
         preferred=None) -> Gang:
    return Gang(name, [GangMember(f"m{i}", [claim(f"{name}-m{i}", gpus)]) for i in range(members)],
                members if min_member is None else min_member, Topology(LEVELS, required, preferred))


def busy_fleet(engine: Engine, nodes: list[dict], share: float = 0.4, seed: int = 7) -> int:
    """Fill ``share`` of the GPUs with 1-4 GPU claims, spread at random over the nodes."""
    rng = random.Random(seed)
    target, used, i = int(share * 8 * len(nodes)), 0, 0
    while used < target:
        node = rng.choice(nodes)["name"]
        count = rng.randint(1, 4)
        if engine.allocate(ClaimGroup([claim(f"busy-{i}", count)], node=node)).allocated:
            used += count
        i += 1
    return used


CASES = {
    "zone-64x8": dict(members=64, required=ZONE, preferred=RACK),
    "zone-64x8-busy": dict(members=64, required=ZONE, preferred=RACK, busy=0.4),
    "rack-17x8": dict(members=17, required=RACK, preferred=BLOCK),
    "fleet-512x8": dict(members=512),
    "elastic-200x8": dict(members=200, min_member=128, required=ZONE, preferred=RACK, busy=0.1),
}


def run_case(name: str, spec: dict, snap: FleetSnapshot, nodes: list[dict], repeat: int) -> dict:
    t0 = time.perf_counter()
    engine = Engine(snap, [])
    placer = GangPlacer(engine, snap)
    build = time.perf_counter() - t0
    if spec.get("busy"):
        busy_fleet(engine, nodes, spec["busy"])
    g = gang(name, spec["members"], min_member=spec.get("min_member"), required=spec.get("required"),
             preferred=spec.get("preferred"))
    topo = g.topology
    t0 = time.perf_counter()
    out = placer.place(g, commit=False)
    cold = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        again = placer.place(g, commit=False)
        times.append(time.perf_counter() - t0)
        assert again.placed == out.placed and [p.node for p in again.placements] == [p.node for p in out.placements]
    times.sort()
    return {"case": name, "placed": out.placed, "members": len(g.members), "placedMembers": len(out.placements),
            "where": out.domains[0].name if out.placed else None, "reason": out.reason,
            "spread": [d["members"] for d in out.preferred_domains(topo)],
            "message": out.message, "engineCalls": out.diagnostics.get("engineCalls"),
            "engineBuildS": round(build, 3), "coldS": round(cold, 4), "warmP50S": round(statistics.median(times), 4),
            "warmP99S": round(times[min(len(times) - 1, int(0.99 * len(times)))], 4)}


def e2e(nodes: list[dict]) -> dict:
    """The service path in a throw-away database: push, create the gang, the worker's placement transaction."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")
    import django
    from django.conf import settings

    django.setup()
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        sys.exit("--e2e runs against PostgreSQL: set DATABASE_URL (make bench does).")
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = \
        f"{settings.DATABASES['default']['NAME']}_gangbench_{os.getpid()}"
    original = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    figures = {}
    try:
        from claims.services import templates as template_services
        from gangs.models import Gang as GangRow
        from gangs.services import gangs as gang_services
        from inventory.models import DeviceClass
        from inventory.services import clusters, sync
        from inventory.services import fleet as fleet_services
        from scheduler.services import gang_placement as placement

        for obj in demo.standard_device_classes():
            if not DeviceClass.objects.filter(cluster=None, name=obj["metadata"]["name"]).exists():
                fleet_services.create_fleet_object(DeviceClass, obj)
        clusters.create_cluster(name="bench", labels={}, with_token=False)
        slices = [s for n in nodes for s in demo.node_slices("h100", n["name"])
                  if s["spec"]["driver"] == "gpu.nvidia.com"]
        t0 = time.perf_counter()
        sync.push_inventory("bench", {"resourceSlices": slices, "nodes": nodes})
        figures["pushS"] = round(time.perf_counter() - t0, 3)
        template_services.create_template("bench", {"metadata": {"name": "h100x8"}, "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}}})
        for i, label in enumerate(("cold", "warm")):  # cold: the first placement builds the worker's engine
            body = {"metadata": {"name": f"train-{i}"}, "spec": {
                "replicas": 64, "template": {"resourceClaims": [{"name": "gpus",
                                                                 "resourceClaimTemplateName": "h100x8"}]},
                "topology": {"levels": list(LEVELS), "required": ZONE, "preferred": RACK}}}
            t0 = time.perf_counter()
            row = _create_without_placement(gang_services, body)  # 64 consumers, 64 claims, one transaction
            figures[f"create64S_{label}"] = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            attempt = placement.place_next(gang_id=row.pk)  # the worker's step: decide, check, write 512 rows
            figures[f"placeTxnS_{label}"] = round(time.perf_counter() - t0, 3)
            figures[f"result_{label}"] = attempt.result
            if attempt.result != "placed":
                sys.exit(f"e2e: the gang was not placed: {GangRow.objects.get(pk=row.pk).message}")
            gang_services.release_gang(row.pk)
    finally:
        connection.creation.destroy_test_db(original, verbosity=0)
    return figures


def _create_without_placement(gang_services, body):
    from unittest import mock

    from gangs import dispatch

    with mock.patch.object(dispatch, "request_placement", lambda *a, **k: None):
        return gang_services.create_gang("bench", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--e2e", action="store_true", help="also time the service path on PostgreSQL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nodes = fleet_nodes()
    t0 = time.perf_counter()
    snap = snapshot(nodes)
    prep = time.perf_counter() - t0
    # Once per process, not per engine: the CEL parser's tables (lark) are built on first use.
    t0 = time.perf_counter()
    tiny = snapshot(fleet_nodes(1))
    GangPlacer(Engine(tiny, []), tiny).place(gang("warmup", 1), commit=False)
    process_warmup = time.perf_counter() - t0
    results = [run_case(name, spec, snap, nodes, args.repeat) for name, spec in CASES.items()
               if args.case in (None, name)]
    extra = e2e(nodes) if args.e2e else None
    if args.json:
        print(json.dumps({"fleet": {"nodes": NODES, "gpus": NODES * 8, "snapshotS": round(prep, 3),
                                    "processWarmupS": round(process_warmup, 3)},
                          "cases": results, "e2e": extra}, indent=2))
        return
    print(f"fleet: {NODES} nodes x 8 H100 ({NODES * 8} GPUs), 2 zones / 32 racks / 128 blocks; "
          f"snapshot built in {prep:.2f} s")
    print(f"{'case':16} {'placed':>7} {'members':>8} {'engine':>7} {'cold s':>8} {'p50 s':>8} {'p99 s':>8}  "
          "where / why")
    for r in results:
        spread = f" ({'+'.join(map(str, r['spread']))} per {RACK.rsplit('/', 1)[-1]})" if r["spread"] else ""
        where = r["where"] + spread if r["placed"] else f"{r['reason']}: {r['message'][:90]}"
        print(f"{r['case']:16} {str(r['placed']):>7} {r['placedMembers']:>4}/{r['members']:<3} {r['engineCalls']:>7} "
              f"{r['coldS']:>8.4f} {r['warmP50S']:>8.4f} {r['warmP99S']:>8.4f}  {where}")
    print(f"engine build per case: {results[0]['engineBuildS']:.2f} s (once per snapshot in the worker); "
          f"CEL parser warm-up once per process: {process_warmup:.2f} s. 'cold' = first placement on a new engine "
          "(builds its selector index).")
    print("Goal: engine decision < 1 s; KAI Scheduler: 48.7 s end to end for 512 pods on 512 nodes.")
    if extra:
        print("end to end (PostgreSQL, in process): " + ", ".join(f"{k} {v}" for k, v in extra.items()))


if __name__ == "__main__":
    main()
