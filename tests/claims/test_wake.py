"""Targeted wake-ups (claims.services.wake) against real PostgreSQL and the real engine: a release makes
eligible only the pending claims the freed devices could serve, and always those. Eligibility is asserted on
``eligible_pending`` and on ``attempts`` (how often a claim was decided), never on timing."""
from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from benchmarks.engine_bench import claim as bench_claim
from benchmarks.engine_bench import exact, gpu_fleet
from claims import claims_sql
from claims.models import DeviceAllocation, PendingWake, Phase, ResourceClaim, WakeKey
from claims.services import claims as claim_services
from claims.services import commit, wake
from dra.engine import ClaimGroup, Engine
from scheduler.services import allocation, wakeups
from tests.claims.fleet import gpu_claim, load_fleet, mig_pair_claim
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team-a"
HOPPER = 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"'
ADA = 'device.attributes["gpu.nvidia.com"].architecture == "Ada Lovelace"'


def arch_claim(name: str, arch: str, count: int = 1) -> dict:
    body = gpu_claim(name, count)
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": arch}}]
    return body


def submit(client, *bodies, ns: str = NS) -> None:
    for body in bodies:
        resp = client.post(f"{ns}/resourceclaims", body, format="json")
        assert resp.status_code == 201, resp.content


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def eligible() -> set[str]:
    """Eligible after the round's wake-up step offered the freed devices (a release alone wakes nobody)."""
    wakeups.wake_for_released()
    return set(allocation.eligible_pending().values_list("name", flat=True))


def claim(name: str) -> ResourceClaim:
    return ResourceClaim.objects.get(name=name)


def release(name: str) -> None:
    claim_services.release_claim(claim(name).id)


def test_l4_release_wakes_no_claim_only_h100s_serve_and_counts_what_a_claim_lacks(admin_client):
    load_fleet({"c-h100": [("h100", 1)], "c-l4": [("l4", 1)]})
    submit(admin_client, *[arch_claim(f"h-{i}", HOPPER) for i in range(8)],
           *[arch_claim(f"l-{i}", ADA) for i in range(4)])
    run_rounds()
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 12  # both clusters full
    submit(admin_client, arch_claim("want-h100", HOPPER), arch_claim("want-2xh100", HOPPER, count=2),
           gpu_claim("any-gpu"))
    run_rounds()
    assert eligible() == set()
    tried = {n: claim(n).attempts for n in ("want-h100", "want-2xh100")}
    assert set(tried.values()) == {1} and claim("want-h100").reason == "Unsatisfiable"

    release("l-0")  # an L4: only the claim any NVIDIA GPU serves can use it
    assert eligible() == {"any-gpu"}
    run_rounds()
    assert claim("any-gpu").phase == Phase.ALLOCATED
    assert {n: claim(n).attempts for n in tried} == tried  # the H100 claims were not decided again

    release("h-0")  # one H100: the 1-GPU claim fits; the 2-GPU claim lacks 2 and is not woken
    assert eligible() == {"want-h100"}
    run_rounds()
    assert claim("want-h100").phase == Phase.ALLOCATED and claim("want-2xh100").attempts == 1

    release("h-1")  # two H100s freed since its attempt (one taken since): woken, one GPU short
    assert eligible() == {"want-2xh100"}
    run_rounds()
    assert claim("want-2xh100").phase == Phase.PENDING and claim("want-2xh100").attempts == 2
    release("h-2")  # now two are free: woken again and placed
    assert eligible() == {"want-2xh100"}
    run_rounds()
    assert claim("want-2xh100").phase == Phase.ALLOCATED


def test_release_of_a_gpu_wakes_a_mig_pair_blocked_by_shared_counters(admin_client):
    load_fleet({"c1": [("a100-mig", 1)]})
    gpus = 0
    while True:  # a 7g.80gb partition on every A100: their counters leave no other partition free
        body = gpu_claim(f"whole-{gpus}", device_class="mig.nvidia.com")
        body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "7g.80gb"'}}]
        submit(admin_client, body)
        run_rounds()
        if claim(f"whole-{gpus}").phase != Phase.ALLOCATED:
            claim_services.delete_claim(claim(f"whole-{gpus}").id)
            break
        gpus += 1
    assert gpus >= 2
    submit(admin_client, mig_pair_claim("mig-pair"))
    run_rounds()
    assert claim("mig-pair").phase == Phase.PENDING and eligible() == set()
    release("whole-0")
    assert eligible() == {"mig-pair"}
    run_rounds()
    assert claim("mig-pair").phase == Phase.ALLOCATED


def test_consumer_group_is_woken_by_each_release_that_may_complete_it(admin_client):
    load_fleet({"c1": [("h100", 1)]})
    submit(admin_client, *[gpu_claim(f"f-{i}") for i in range(8)])
    run_rounds()
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one"},
                "spec": {"spec": gpu_claim("x")["spec"]}}
    assert admin_client.post(f"{NS}/resourceclaimtemplates", template, format="json").status_code == 201
    consumer = {"kind": "Consumer", "metadata": {"name": "pod-1"}, "spec": {"resourceClaims": [
        {"name": "a", "resourceClaimTemplateName": "one"}, {"name": "b", "resourceClaimTemplateName": "one"}]}}
    resp = admin_client.post(f"{NS}/consumers", consumer, format="json")
    assert resp.status_code == 201, resp.content
    names = {s["resourceClaimName"] for s in resp.json()["status"]["resourceClaimStatuses"]}
    run_rounds()
    assert eligible() == set() and {claim(n).phase for n in names} == {Phase.PENDING}
    release("f-0")
    assert names <= eligible()
    run_rounds()
    assert {claim(n).phase for n in names} == {Phase.PENDING}  # one GPU for two claims
    release("f-1")
    assert names <= eligible()
    run_rounds()
    assert {claim(n).phase for n in names} == {Phase.ALLOCATED}


def test_claim_waiting_for_quota_wakes_when_its_queue_releases(admin_client):
    load_fleet({"c1": [("h100", 2)]})
    resp = admin_client.post("/api/v1/queues", queue_body("team", namespaces=["a"], gpus=2, borrowing=0),
                             format="json")
    assert resp.status_code == 201, resp.content
    ns = "/api/v1/namespaces/a"
    submit(admin_client, *[gpu_claim(f"q-{i}") for i in range(3)], ns=ns)
    run_rounds()
    waiting = ResourceClaim.objects.get(namespace__name="a", phase=Phase.PENDING)
    assert waiting.reason == "WaitingForQuota" and eligible() == set()
    release(next(n for n in ("q-0", "q-1", "q-2") if n != waiting.name))
    assert eligible() == {waiting.name}
    run_rounds()
    assert claim(waiting.name).phase == Phase.ALLOCATED


def test_a_release_the_decision_may_not_have_seen_makes_the_claim_retry_at_once(admin_client):
    load_fleet({"c1": [("h100", 1)]})
    submit(admin_client, *[gpu_claim(f"f-{i}") for i in range(8)], gpu_claim("late"))
    run_rounds()
    late = claim("late")
    read_at = allocation.read_version()  # as a round reads it with the claim
    release("f-0")  # commits while that round's engine runs
    with transaction.atomic():
        commit.set_pending([late], "Unsatisfiable", "no", None, read_at, timezone.now(), [],
                           wake_keys=((wake.cluster_key("c1"), 5),))
        commit.record([late], [])
    assert claim("late").attempted_version is None and not PendingWake.objects.filter(claim=late).exists()
    assert "late" in eligible()


def test_wake_rows_follow_the_claim(admin_client):
    load_fleet({"c1": [("h100", 1)]})
    # "head" fails first: the queue's head, which holds no node for one device, so "w" waits by its count.
    submit(admin_client, *[gpu_claim(f"f-{i}") for i in range(8)], gpu_claim("head"), gpu_claim("w", count=3))
    run_rounds()
    rows = list(PendingWake.objects.filter(claim=claim("w")).values_list("key_id", "wake_at"))
    base = wake.counters([wake.cluster_key("c1")])[wake.cluster_key("c1")] if rows else None
    assert rows == [(wake.cluster_key("c1"), base + 3)]  # three GPUs short, in the one cluster with H100s
    for i in range(4):
        release(f"f-{i}")
    run_rounds()
    assert claim("w").phase == Phase.ALLOCATED and not PendingWake.objects.filter(claim=claim("w")).exists()
    assert DeviceAllocation.objects.filter(claim=claim("w")).count() == 3


def test_only_the_oldest_head_of_a_queue_waits_for_any_release(admin_client):
    load_fleet({"c1": [("h100", 2)]})
    submit(admin_client, *[gpu_claim(f"f-{i}") for i in range(16)])
    run_rounds()
    submit(admin_client, gpu_claim("older", count=3), gpu_claim("younger", count=3))
    # One claim a round: each is its round's first failure, so each becomes the queue's head and holds a node.
    assert allocation.allocate_round(batch_size=1).taken == 1
    assert allocation.allocate_round(batch_size=1).taken == 1
    heads = dict(PendingWake.objects.values_list("claim__name", "head_of"))
    assert heads["older"] != "" and heads["younger"] == ""  # the younger one waits by its count again
    release("f-0")  # one GPU: only the head is decided again (and keeps its node held)
    assert eligible() == {"older"}
    run_rounds()
    assert claim("older").attempts == 2 and claim("younger").attempts == 1


def test_eligible_are_the_never_tried_the_woken_and_all_after_a_wake_all_and_taken_ones_are_left_out(admin_client):
    # take() reads the eligible ids from three indexed parts (allocation.undecided_pending): each part counts.
    load_fleet({"c1": [("h100", 1)]})
    # "one" fails first: the queue's head, which holds no node for one device, so "two" waits by its count.
    submit(admin_client, *[gpu_claim(f"f-{i}") for i in range(8)], gpu_claim("one"), gpu_claim("two", count=2))
    run_rounds()
    assert eligible() == set()
    submit(admin_client, gpu_claim("new"))
    assert eligible() == {"new"}  # never tried
    release("f-0")
    assert eligible() == {"new", "one"}  # one GPU freed: not what "two" lacks
    with transaction.atomic():
        allocation.bump_fleet_version()  # an inventory change: every pending claim is tried again
    assert eligible() == {"new", "one", "two"}
    taken, _ = allocation.take(2)
    assert [c.name for c in taken] == ["one", "two"]  # oldest first
    assert eligible() == {"new"}
    assert set(allocation.undecided_pending().values_list("name", flat=True)) == {"new", "one", "two"}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert {c.taken_by for c in ResourceClaim.objects.filter(name__in=["one", "two"])} == {cursor.fetchone()[0]}


def test_a_claim_waits_for_what_one_node_lacks_not_for_what_the_cluster_lacks(admin_client):
    """A group is placed on one node: with 2 + 3 GPUs free on two nodes, a 6-GPU claim lacks 3 on the best
    node, though only 1 in the cluster. Releases that cannot make one node reach 6 do not wake it. (Its queue's
    head is an older L4 claim: a head is woken by any release where it could go.)"""
    load_fleet({"c-h100": [("h100", 2)], "c-l4": [("l4", 1)]})
    submit(admin_client, *[arch_claim(f"j-{i}", HOPPER) for i in range(13)],
           *[arch_claim(f"l-{i}", ADA) for i in range(4)])
    run_rounds()
    by_node: dict[str, list[str]] = {}
    for name, node in ResourceClaim.objects.filter(phase=Phase.ALLOCATED, cluster="c-h100").values_list("name",
                                                                                                       "node"):
        by_node.setdefault(node, []).append(name)
    full, other = sorted(by_node, key=lambda n: -len(by_node[n]))
    assert (len(by_node[full]), len(by_node[other])) == (8, 5)  # bin-packed: 0 and 3 free
    release(by_node[full].pop())
    release(by_node[full].pop())  # 2 and 3 free
    submit(admin_client, arch_claim("head", ADA), arch_claim("want-6", HOPPER, count=6))
    run_rounds()
    assert claim("want-6").phase == Phase.PENDING and claim("want-6").attempts == 1
    assert PendingWake.objects.get(claim=claim("want-6")).short == 3

    release(by_node[full].pop())  # 3 and 3: 6 free in the cluster, at most 3 on one node
    assert eligible() == set()
    release(by_node[other].pop())
    release(by_node[other].pop())  # 3 and 5: three freed since its attempt, what its best node lacked
    assert eligible() == {"want-6"}
    run_rounds()
    assert claim("want-6").phase == Phase.PENDING and claim("want-6").attempts == 2
    release(by_node[other].pop())  # 6 free on one node
    assert eligible() == {"want-6"}
    run_rounds()
    assert claim("want-6").phase == Phase.ALLOCATED and claim("want-6").node == other


def test_what_one_node_lacks_is_bounded_by_the_nodes_not_listed():
    """``best_nodes`` lists the top 5: a cluster with no node listed may have as many as the last one listed
    (on a node, and again network-attached), never more; a full list can't be read as 'nothing else'."""
    class Outcome:
        reason = "unsatisfiable"

        def __init__(self, best):
            self.diagnostics = {"requests": [{"claim": "ns/c", "request": "r", "count": 10, "available": 9,
                                              "dropped": {"allocated": 3}, "best_nodes": best,
                                              "clusters_matching": {"a": 5, "b": 4}}]}

    top = [{"node": f"a/n{i}", "available": 4 - i // 2} for i in range(5)]  # a/n0..n4: 4 4 3 3 2
    assert dict(wake.wants(Outcome(top))) == {"cluster:a": 4, "cluster:b": 6}  # a: 4 + 2, b: 2 + 2 at most
    with_network = [{"node": "b/(network)", "available": 5}, *top[:4]]  # 5 4 4 3 3
    assert dict(wake.wants(Outcome(with_network))) == {"cluster:a": 3, "cluster:b": 2}  # a: 4+3, b: 3+5
    short_list = [{"node": "a/n0", "available": 4}]
    assert dict(wake.wants(Outcome(short_list))) == {"cluster:a": 6, "cluster:b": 10}


def test_a_sampled_explanation_waits_for_any_release():
    """An explanation cut by the engine's budget (dra.engine.explain_walk) counted only some of the available
    devices, so the shortfall it implies may be too large: the claim waits for any release. The same failure
    explained in full waits for its cluster."""
    engine = Engine(gpu_fleet(4, 8))
    for n in range(3):
        assert engine.allocate(ClaimGroup(key=f"f{n}", claims=[bench_claim(f"f{n}", [exact("gpu", "gpu", 8)])])
                               ).allocated
    big = ClaimGroup(key="big", claims=[bench_claim("big", [exact("gpu", "gpu", 9)])])
    full = engine.allocate(big)
    assert not full.allocated and "sampled" not in full.diagnostics
    assert wake.wants(full) == (("cluster:bench", 1),)  # 8 available, 9 wanted
    engine.explain_checks = 4
    cut = engine.allocate(ClaimGroup(key="bigger", claims=[bench_claim("bigger", [exact("gpu", "gpu", 10)])]))
    assert cut.diagnostics["sampled"] and cut.diagnostics["requests"][0]["available"] < 8
    assert wake.wants(cut) == wake.ANY_RELEASE


def test_a_release_counts_its_devices_in_rows_of_its_own_and_moves_the_fleet_version(admin_client):
    """A release writes no row another release writes: its counts are FreedCount rows (folded into their
    WakeKey by the worker, counters unchanged), FleetState stays as it was, and the fleet version still moves."""
    from claims.models import FleetState, FreedCount
    from usage.models import UsageInterval

    load_fleet({"c1": [("h100", 2)]})
    submit(admin_client, gpu_claim("a", count=3), gpu_claim("b", count=2))
    run_rounds()
    wake.roll_up()
    keys = [wake.ANY, wake.cluster_key("c1")]
    state, version, counted = FleetState.objects.get(), allocation.fleet_version(), wake.counters(keys)
    folded = dict(WakeKey.objects.filter(key__in=keys).values_list("key", "freed"))
    assert UsageInterval.objects.filter(claim_id=claim("a").id, ended_at__isnull=True).count() == 3
    release("a")  # one statement: its rows deleted, intervals closed, devices counted and offered
    assert sorted(FreedCount.objects.values_list("key", "freed")) == [(wake.ANY, 3), (wake.cluster_key("c1"), 3)]
    assert wake.counters(keys) == {k: counted.get(k, 0) + 3 for k in keys}
    assert dict(WakeKey.objects.filter(key__in=keys).values_list("key", "freed")) == folded  # not written
    fresh = FleetState.objects.get()
    assert (fresh.version, fresh.wake_all_version, fresh.updated_at) == (state.version, state.wake_all_version,
                                                                         state.updated_at)
    assert allocation.fleet_version() == version + 3
    assert not DeviceAllocation.objects.filter(claim=claim("a")).exists()
    assert not UsageInterval.objects.filter(claim_id=claim("a").id, ended_at__isnull=True).exists()
    assert wake.roll_up() == 2
    assert not FreedCount.objects.exists() and wake.counters(keys) == {k: counted.get(k, 0) + 3 for k in keys}
    assert allocation.fleet_version() == version + 3  # folding changes no counter
    FleetState.objects.all().delete()  # a flushed database: the release needs no row, the version reader makes it
    release("b")
    assert wake.counters([wake.ANY]) == {wake.ANY: counted.get(wake.ANY, 0) + 5}
    assert allocation.fleet_version() == 1 + counted.get(wake.ANY, 0) + 5
    assert FleetState.objects.filter(pk=1).exists()


def test_a_round_stamps_claims_with_the_counters_read_after_the_take_and_a_wake_all_moves_only_the_claims_version(
        admin_client):
    load_fleet({"c1": [("h100", 1)]})
    submit(admin_client, *[gpu_claim(f"f-{i}") for i in range(8)], gpu_claim("late"))
    run_rounds()
    taken_at = allocation.read_version()
    assert taken_at.freed == wake.counters() and int(taken_at) == allocation.claims_version()
    release("f-0")
    assert allocation.read_version().freed[wake.ANY] == taken_at.freed.get(wake.ANY, 0) + 1
    before = allocation.fleet_version()
    with transaction.atomic():
        allocation.bump_fleet_version()
    assert allocation.claims_version() == int(taken_at) + 1 and allocation.fleet_version() == before + 1


def test_on_sqlite_a_release_counts_on_the_counters_and_wakes_the_claim_it_completes(tmp_path):
    """SQLite (the embedded default, one writer at a time): a release updates the counters themselves (no
    FreedCount rows to fold); the queue's head waiting for two devices is decided again at each release (a
    head holds its node) and placed at the second."""
    import subprocess
    import sys

    from django.conf import settings

    script = (
        "import django; django.setup()\n"
        "from django.core.management import call_command; call_command('migrate', verbosity=0)\n"
        "from claims.models import FreedCount, Phase, ResourceClaim\n"
        "from claims.services import claims as cs, taking, wake\n"
        "from scheduler.services import allocation\n"
        "from tests.claims import fleet as fh\n"
        "def rounds():\n"
        "    while allocation.allocate_round().taken: pass\n"
        "def phase(name): return ResourceClaim.objects.get(name=name).phase\n"
        "fh.load_fleet({'c1': [('h100', 1)]})\n"
        "cs.create_claims('team-a', [fh.gpu_claim(f'f-{i}') for i in range(8)] + [fh.gpu_claim('late', 2)])\n"
        "rounds(); assert phase('late') == Phase.PENDING\n"
        "version, tried = taking.fleet_version(), ResourceClaim.objects.get(name='late').attempts\n"
        "cs.release_claim(ResourceClaim.objects.get(name='f-0').id); rounds()\n"
        "assert taking.fleet_version() == version + 1 and not FreedCount.objects.exists()\n"
        "assert phase('late') == Phase.PENDING and ResourceClaim.objects.get(name='late').attempts == tried + 1\n"
        "cs.release_claim(ResourceClaim.objects.get(name='f-1').id); rounds()\n"
        "assert phase('late') == Phase.ALLOCATED, phase('late')\n"
        "assert wake.counters() == {'*': 2, 'cluster:c1': 2}, wake.counters()\n"
        "print('ok')\n")
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "PATH": "/usr/bin:/bin",
           "DJANGO_SETTINGS_MODULE": "draservice.settings", "LOG_LEVEL": "WARNING"}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(settings.BASE_DIR), capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_offers_still_free_are_told_from_those_taken_again_in_one_read(admin_client):
    """The wake-up step drops an offer whose device a claim took again: of 64 devices asked about (a full batch of
    offers), exactly those an allocation holds come back, in one statement, an admin-access hold not counted."""
    load_fleet({"c-h100": [("h100", 1)]})
    submit(admin_client, *[arch_claim(f"h-{i}", HOPPER) for i in range(3)])
    run_rounds()
    held = list(DeviceAllocation.objects.values_list("cluster", "driver", "pool", "device"))
    assert len(held) == 3
    cluster, driver, pool, _ = held[0]
    admin = DeviceAllocation.objects.get(device=held[2][3])
    admin.admin_access = True
    admin.save(update_fields=["admin_access"])
    asked = held + [(cluster, driver, pool, f"not-held-{i}") for i in range(61)]
    with CaptureQueriesContext(connection) as queries:
        found = claims_sql.allocated_among(asked)
    assert found == set(held[:2]) and len(queries) == 1
    assert claims_sql.allocated_among([]) == set()
