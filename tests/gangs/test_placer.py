"""``dra.gang`` on its own: no Django, no database; real driver shapes, the real engine."""
from __future__ import annotations

import pytest

from dra.engine import AllocatedDevice, ClaimGroup, Engine
from dra.gang import Gang, GangMember, GangPlacer, GangReason, GangSpecError, Topology
from tests.gangs import fleet
from tests.gangs.fleet import BLOCK, LEVELS, RACK, ZONE, claim_body

TOPO = Topology(tuple(LEVELS), RACK, BLOCK)


def gang(n, count=8, min_member=None, topology=TOPO, prefix="g", **kw) -> Gang:
    members = [GangMember(f"m{i}", [claim_body(f"{prefix}-m{i}", count)]) for i in range(n)]
    return Gang(prefix, members, n if min_member is None else min_member, topology, **kw)


def placer(snap=None, allocated=()):
    snap = snap or fleet.snapshot()
    engine = Engine(snap, list(allocated))
    return engine, GangPlacer(engine, snap)


def nodes_of(outcome) -> list[str]:
    return [p.node for p in outcome.placements]


def free_gpus(engine, nodes=None) -> dict[str, int]:
    """Free GPUs per node, asked through the engine's public API (allocate, then give back)."""
    out = {}
    for n in nodes or [n["name"] for n in fleet.nodes("c1")]:
        for count in range(8, 0, -1):
            got = engine.allocate(ClaimGroup([claim_body(f"probe-{n}-{count}", count, namespace="probe")], node=n))
            if got.allocated:
                engine.release(got.devices)
                out[n] = count
                break
        else:
            out[n] = 0
    return out


def busy(engine, node: str, count: int, name: str):
    """Take ``count`` GPUs on ``node`` through the engine, as another workload would."""
    out = engine.allocate(ClaimGroup([claim_body(name, count, namespace="other")], node=node))
    assert out.allocated
    return out


def test_fits_only_in_one_rack_lands_there():
    engine, p = placer()
    out = p.place(gang(4))
    assert out.placed, out.message
    assert out.domain == {ZONE: "zone-a", RACK: "rack-a1"}
    assert {pl.labels[RACK] for pl in out.placements} == {"rack-a1"}
    assert len(set(nodes_of(out))) == 4  # one 8-GPU member per node
    # Each member got its own 8 distinct GPUs; the engine now counts all 32 as in use.
    devices = {(d.pool, d.device) for d in out.devices}
    assert len(devices) == 32
    assert not engine.allocate(ClaimGroup([claim_body("x", 1)], node=out.placements[0].node)).allocated


def test_cannot_fit_in_any_single_rack_says_so_and_names_the_closest():
    engine, p = placer()
    out = p.place(gang(5))  # 5 nodes' worth; the largest rack has 4, the fleet has 9
    assert not out.placed
    assert out.reason == GangReason.NO_DOMAIN_FITS
    assert out.closest.domain == {ZONE: "zone-a", RACK: "rack-a1"}
    assert out.closest.capacity == 4
    assert out.closest.free_devices == 32 and out.closest.needed_devices == 40
    assert "rack-a1" in out.message and "room for 4" in out.message
    assert out.diagnostics["fleetCapacity"] == 9  # the whole fleet could: the topology is what blocks it
    assert not out.placements and not out.devices
    # Nothing is held: every node still takes a whole 8-GPU claim.
    for n in fleet.nodes("c1"):
        assert engine.allocate(ClaimGroup([claim_body(f"probe-{n['name']}", 8)], node=n["name"])).allocated


def test_preferred_level_keeps_members_in_one_block_when_one_can_hold_them():
    _, p = placer()
    out = p.place(gang(2))
    assert out.placed
    blocks = {pl.labels[BLOCK] for pl in out.placements}
    assert len(blocks) == 1
    # The tightest rack: rack-a2 has exactly 2 nodes; rack-a1 (4) and rack-b1 (3) stay whole for bigger gangs.
    assert out.domain[RACK] == "rack-a2"
    assert out.preferred_domains(TOPO) == [{"domain": {ZONE: "zone-a", RACK: "rack-a2", BLOCK: "block-3"},
                                            "members": 2}]


def test_preferred_level_spread_over_the_fewest_blocks():
    _, p = placer()
    out = p.place(gang(4))  # rack-a1 only; its blocks hold 2 each
    spread = out.preferred_domains(TOPO)
    assert [d["members"] for d in spread] == [2, 2]


def test_least_fragmenting_domain_wins_among_those_that_fit():
    engine, p = placer()
    # rack-b1 (3 nodes) and rack-a1 (4 nodes) both hold a 3-member gang; with one node of rack-a1 busy,
    # rack-a1 has exactly 3 free nodes: filling it keeps rack-b1 whole.
    busy(engine, "c1-block-1-n0", 8, "filler")
    out = p.place(gang(3, topology=Topology(tuple(LEVELS), RACK)))
    assert out.placed
    assert out.domain[RACK] == "rack-a1"
    assert "c1-block-1-n0" not in nodes_of(out)


def test_min_member_places_what_fits_and_lists_the_rest():
    _, p = placer()
    out = p.place(gang(6, min_member=4))
    assert out.placed
    assert len(out.placements) == 4 and out.domain[RACK] == "rack-a1"
    assert out.unplaced == ["m4", "m5"]


def test_without_topology_the_gang_stays_in_one_cluster():
    snap = fleet.snapshot({"c1": fleet.nodes("c1"), "c2": fleet.nodes("c2")})
    _, p = placer(snap)
    out = p.place(gang(9, topology=Topology()))
    assert out.placed and {pl.cluster for pl in out.placements} == {out.cluster}
    out2 = p.place(gang(10, topology=Topology(), prefix="h"))  # 10 nodes: neither cluster has them
    assert not out2.placed and out2.reason == GangReason.NO_DOMAIN_FITS
    assert "cluster" in out2.message


def test_members_keep_their_claims_own_constraints():
    # MIG nodes: each member wants two 1g.10gb partitions of ONE parent GPU (matchAttribute parentUUID), and
    # partitions of a GPU exclude each other through its counters. The engine checks both for every member.
    layout = {"zone-a": {"rack-a1": {"block-1": 1}}, "zone-b": {"rack-b1": {"block-4": 2}}}
    snap = fleet.snapshot({"m": fleet.nodes("m", layout)}, node_type="a100-mig")
    sel = ['device.attributes["gpu.nvidia.com"].profile == "1g.10gb"']
    req = [{"name": n, "exactly": {"deviceClassName": "mig.nvidia.com", "count": 1,
                                   "selectors": [{"cel": {"expression": e}} for e in sel]}} for n in ("a", "b")]
    cons = [{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]
    members = [GangMember(f"m{i}", [claim_body(f"mig-m{i}", requests=req, constraints=cons)]) for i in range(40)]
    engine, p = placer(snap)
    out = p.place(Gang("mig", members, 40, Topology(tuple(LEVELS), RACK)))
    # Seven 1g.10gb slots per GPU make 3 same-parent pairs, 24 per node: only rack-b1 (2 nodes) holds 40.
    assert out.placed, out.message
    assert out.domain[RACK] == "rack-b1"
    for pl in out.placements:
        results = pl.outcome.claims[0].allocation["devices"]["results"]
        parents = {engine.by_id[("m", r["driver"], r["pool"], r["device"])].attribute(
            "gpu.nvidia.com/parentUUID")["string"] for r in results}
        assert [r["request"] for r in results] == ["a", "b"] and len(parents) == 1
    assert len({(d.pool, d.device) for d in out.devices}) == 80


def test_optimistic_bound_fails_exactly_then_next_domain_and_nothing_leaks():
    # Members need 4 GPUs under ONE PCIe root; the demo H100 has at most 2 per root, so no node can hold one.
    # The free-device bound (8 per node) says yes; the exact search says no in every domain; nothing is kept.
    req = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}]
    cons = [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    members = [GangMember(f"m{i}", [claim_body(f"p-m{i}", requests=req, constraints=cons)]) for i in range(2)]
    engine, p = placer()
    out = p.place(Gang("p", members, 2, Topology(tuple(LEVELS), RACK)))
    assert not out.placed
    assert out.reason == GangReason.MEMBERS_DO_NOT_FIT
    assert out.diagnostics["tried"] >= 2
    assert out.diagnostics["memberFailure"]["member"] == "m0"
    assert all(r.placeable == 0 for r in out.domains if r.placeable is not None)
    assert set(free_gpus(engine).values()) == {8}  # every trial was rolled back


def test_rolls_back_a_domain_that_falls_short_and_uses_the_next():
    # rack-b1 (3 nodes) is the tightest fit for 3 members, but one GPU of its last node carries a NoSchedule
    # taint. The free-device bound does not see taints (it is only a bound); the exact search does: two
    # members land in rack-b1, the third cannot, so both are rolled back and the gang goes to rack-a1.
    snap = fleet.snapshot()
    for s_ in snap.clusters[0].resource_slices:
        if s_["spec"]["nodeName"] == "c1-block-4-n2":
            s_["spec"]["devices"][0]["taints"] = [{"key": "maintenance", "value": "ecc", "effect": "NoSchedule"}]
    engine, p = placer(snap)
    out = p.place(gang(3, topology=Topology(tuple(LEVELS), RACK)))
    assert out.placed
    assert out.domain[RACK] == "rack-a1"
    short = next(r for r in out.domains if r.domain.get(RACK) == "rack-b1")
    assert short.state == "fell_short" and short.placeable == 2
    assert out.diagnostics["tried"] == 2
    # Nothing of the rolled-back attempt is held: rack-b1's untainted nodes take whole 8-GPU claims.
    for n in ("c1-block-4-n0", "c1-block-4-n1"):
        assert engine.allocate(ClaimGroup([claim_body(f"probe-{n}", 8)], node=n)).allocated
    p.release_placements(out.placements)
    assert free_gpus(engine, ["c1-block-1-n0", "c1-block-4-n0", "c1-block-4-n2"]) == {
        "c1-block-1-n0": 8, "c1-block-4-n0": 0, "c1-block-4-n2": 7}  # only the probes are held (and the taint)


def test_what_if_leaves_the_engine_as_it_was():
    engine, p = placer()
    before = free_gpus(engine)
    out = p.place(gang(4), commit=False)
    assert out.placed and free_gpus(engine) == before
    again = p.place(gang(4), commit=False)
    assert nodes_of(again) == nodes_of(out)  # deterministic, and nothing was kept


def test_nodes_without_the_required_label_are_not_used():
    ns = fleet.nodes("c1")
    for n in ns:
        n["labels"].pop(RACK)
    _, p = placer(fleet.snapshot({"c1": ns}))
    out = p.place(gang(1))
    assert not out.placed and out.reason == GangReason.NO_TOPOLOGY_DOMAIN
    assert out.diagnostics["unlabelledNodes"] == 9


def test_stale_and_disallowed_clusters_are_skipped():
    snap = fleet.snapshot({"c1": fleet.nodes("c1"), "c2": fleet.nodes("c2")}, stale={"c1"})
    _, p = placer(snap)
    out = p.place(gang(2))
    assert out.placed and out.cluster == "c2"
    out = p.place(gang(2, prefix="h", allowed_clusters=["c1"]))
    assert not out.placed and out.reason == GangReason.NO_ELIGIBLE_CLUSTER


def test_within_one_domain_only():
    _, p = placer()
    out = p.place(gang(2, min_member=1), within=("c1", {ZONE: "zone-b", RACK: "rack-b1"}))
    assert out.placed and {pl.labels[RACK] for pl in out.placements} == {"rack-b1"}


def test_heterogeneous_members_largest_first():
    members = [GangMember("launcher", [claim_body("het-l", 1)])] + \
              [GangMember(f"w{i}", [claim_body(f"het-w{i}", 8)]) for i in range(2)]
    _, p = placer()
    out = p.place(Gang("het", members, 3, Topology(tuple(LEVELS), RACK, BLOCK)))
    assert out.placed
    nodes = {pl.member: pl.node for pl in out.placements}
    assert nodes["w0"] != nodes["w1"] and len({pl.labels[RACK] for pl in out.placements}) == 1
    # The 1-GPU launcher went where it fits, not onto a node a worker needed (workers were placed first).
    assert nodes["launcher"] not in (nodes["w0"], nodes["w1"])


def test_invalid_member_claims_and_unknown_classes():
    _, p = placer()
    bad = gang(2)
    bad.members[1].claims[0]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].productName =="}}]
    out = p.place(bad)
    assert out.reason == GangReason.INVALID and out.error_member == "m1" and out.error.code == "cel_error"
    unknown = gang(1, prefix="u")
    unknown.members[0].claims[0]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nope"
    out = p.place(unknown)
    assert out.reason == GangReason.NO_ELIGIBLE_CLUSTER and "nope" in out.message


@pytest.mark.parametrize("topology, field", [
    (Topology((ZONE, RACK), BLOCK), "topology.required"),
    (Topology((ZONE, RACK), RACK, ZONE), "topology.preferred"),
    (Topology((ZONE, ZONE)), "topology.levels[1]"),
    (Topology(("not a label!",)), "topology.levels[0]"),
])
def test_topology_validation(topology, field):
    assert field in [p for p, _ in topology.errors()]
    _, p = placer()
    with pytest.raises(GangSpecError):
        p.place(gang(1, topology=topology))


def test_min_member_out_of_range():
    _, p = placer()
    with pytest.raises(GangSpecError):
        p.place(gang(2, min_member=3))


def test_allocated_devices_from_elsewhere_count():
    snap = fleet.snapshot()
    # Everything in rack-a1 except one node is in use by someone else: a 2-member rack gang goes elsewhere.
    taken = []
    for n in ("c1-block-1-n0", "c1-block-1-n1", "c1-block-2-n0"):
        taken += [AllocatedDevice("c1", "gpu.nvidia.com", n, f"gpu-{i}") for i in range(8)]
    engine, p = placer(snap, taken)
    out = p.place(gang(2, topology=Topology(tuple(LEVELS), RACK)))
    assert out.placed and out.domain[RACK] == "rack-a2"
