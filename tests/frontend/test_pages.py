"""Server-side checks of the dashboard (Django test client): access control, the write actions' permission
gate, and that the fleet aggregates agree with counts taken a different way (ORM, device by device)."""
import pytest
from django.urls import reverse

from claims.models import DeviceAllocation, Phase, ResourceClaim
from inventory.models import Device, DeviceTaintRule

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = ["/", "/utilisation/", "/utilisation/?range=7d", "/clusters/", "/sharing/", "/fragmentation/", "/claims/",
         "/claims/?phase=Pending", "/claims/?class=gpu.nvidia.com", "/inventory/slices/", "/inventory/pools/",
         "/inventory/pools/?state=incomplete", "/inventory/deviceclasses/", "/inventory/deviceclasses/gpu.nvidia.com/",
         "/inventory/taintrules/"]


def test_every_page_needs_a_login(client, demo):
    for url in PAGES:
        resp = client.get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/"), url


def test_every_page_renders_for_a_read_only_user(client, demo, people):
    client.force_login(people["viewer"])
    for url in PAGES:
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert b"read-only" in resp.content, url
        # Read-only users are never offered a write action.
        assert b'data-testid="release"' not in resp.content and b'data-testid="taint-form"' not in resp.content


def test_read_only_user_cannot_release_or_taint(client, demo, people):
    client.force_login(people["viewer"])
    claim = ResourceClaim.objects.get(namespace__name="ml-training", name="bert-eval")
    assert claim.phase == Phase.ALLOCATED
    resp = client.post(reverse("frontend:release-claim", args=["ml-training", "bert-eval"]))
    assert resp.status_code == 403
    claim.refresh_from_db()
    assert claim.phase == Phase.ALLOCATED and claim.device_allocations.exists()

    d = Device.objects.filter(driver="gpu.nvidia.com").first()
    rules = DeviceTaintRule.objects.count()
    resp = client.post(reverse("frontend:taint-device", args=[d.cluster.name, d.driver, d.pool_name, d.name]),
                       {"effect": "NoSchedule", "reason": "x"})
    assert resp.status_code == 403
    assert DeviceTaintRule.objects.count() == rules


def test_operator_releases_a_claim_and_taints_a_device(client, demo, people):
    client.force_login(people["ops"])
    resp = client.post(reverse("frontend:release-claim", args=["ml-training", "bert-eval"]), follow=True)
    assert resp.status_code == 200
    claim = ResourceClaim.objects.get(namespace__name="ml-training", name="bert-eval")
    assert claim.phase == Phase.RELEASED
    assert not DeviceAllocation.objects.filter(claim=claim).exists()
    assert claim.events.filter(reason="ReleasedByOperator").exists()

    d = Device.objects.filter(driver="gpu.amd.com").order_by("id").first()
    resp = client.post(reverse("frontend:taint-device", args=[d.cluster.name, d.driver, d.pool_name, d.name]),
                       {"effect": "NoExecute", "reason": "fan failure"}, follow=True)
    assert resp.status_code == 200
    rule = DeviceTaintRule.objects.get(device_name=d.name, pool_name=d.pool_name)
    assert rule.effect == "NoExecute" and rule.object["spec"]["taint"]["value"] == "ops"
    assert b"NoExecute" in resp.content  # the device page now lists the taint


def test_overview_totals_match_a_device_by_device_count(client, demo, people):
    """The overview's SQL aggregate against an independent count in Python over every device: a counter set
    is one accelerator, a standalone device one if a class marked as an accelerator selects it (evaluated
    device by device)."""
    from claims.services.figures.fleet import fleet_overview
    from dra.cel import CELDevice, compile_expression
    from inventory.models import DeviceClass

    data = fleet_overview()
    marked = [[compile_expression(s["cel"]["expression"]) for s in c.object["spec"]["selectors"]]
              for c in DeviceClass.objects.all()
              if c.object["metadata"].get("annotations", {}).get("draservice.io/accelerator") == "true"]
    assert len(marked) == 5

    def accelerator(d) -> bool:
        device = CELDevice(d.driver, d.attributes, d.capacity, d.allow_multiple_allocations)
        return any(all(e.evaluate(device) for e in exprs) for exprs in marked)

    units, used = set(), set()
    held = {(a.cluster, a.driver, a.pool, a.device) for a in DeviceAllocation.objects.filter(admin_access=False)}
    helpers = 0
    for d in Device.objects.select_related("cluster"):
        cs = d.consumes_counters[0]["counterSet"] if d.consumes_counters else None
        if cs is None and not accelerator(d):
            helpers += 1
            continue
        unit = (d.cluster.name, d.driver, d.pool_name, cs or d.name)
        units.add(unit)
        if (d.cluster.name, d.driver, d.pool_name, d.name) in held:
            used.add(unit)
    assert helpers > 0  # the compute-domain channels and daemons of the H100 nodes
    assert data["totals"].total == len(units)
    assert data["totals"].allocated == len(used)
    assert "(no product name)" not in [g.label for g in data["by_product"] if g.extra["driver"] != "gpu.example.com"]
    assert sum(data["totals"].states.values()) == data["totals"].total
    assert data["totals"].total == sum(g.tally.total for g in data["by_cluster"])
    assert data["pending"]["count"] == ResourceClaim.objects.filter(phase=Phase.PENDING).count() >= 2
    assert [c.name for c in data["stale_clusters"]] == [demo["stale_cluster"]]
    # The shared L4 (one claim, three consumers), the two lab notebooks' device and the split MIG GPU.
    assert data["totals"].shared >= 2


def test_selector_count_matches_evaluating_every_device(demo):
    """The grouped count (one CEL evaluation per distinct footprint) equals a one-by-one evaluation."""
    from dra.cel import CELDevice, compile_expression
    from inventory.services.selectors import try_selector

    expr = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
    result = try_selector(expr, device_class="gpu.nvidia.com")
    assert result.valid and result.exhaustive
    compiled = [compile_expression(e) for e in (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'", expr)]
    expected = 0
    for d in Device.objects.all():
        dev = CELDevice(d.driver, d.attributes, d.capacity, d.allow_multiple_allocations)
        try:
            if all(c.evaluate(dev) for c in compiled):
                expected += 1
        except Exception:
            pass
    assert expected > 0
    assert result.matches == expected
    assert result.groups < expected  # it really grouped

    bad = try_selector('device.attributes["gpu.nvidia.com"].productName ==')
    assert not bad.valid and bad.error


def test_mig_layout_shows_partitions_on_their_memory_slices(client, demo, people):
    client.force_login(people["ops"])
    cluster, node = demo["mig_node"]
    resp = client.get(reverse("frontend:node", args=[cluster, node]))
    assert resp.status_code == 200
    layout = resp.context["layout"]
    gpu = next(cs for cs in layout.counter_sets if cs.in_use and any(m.profile == "3g.40gb" for m in cs.in_use))
    block = next(b for b in gpu.blocks if b.label == "3g.40gb")
    assert block.span == 4 and block.state in ("allocated", "shared")
    taken = sum(b.span for b in gpu.blocks if b.state != "free")
    free = sum(b.span for b in gpu.blocks if b.state == "free")
    assert taken + free == gpu.slice_count == 8
    # Counters used are exactly the sum of what the partitions in use consume.
    assert gpu.used["multiprocessors"] == sum(m.consumption(gpu.name)["multiprocessors"] for m in gpu.in_use)


def test_unknown_things_are_404_not_errors(client, demo, people):
    client.force_login(people["viewer"])
    for url in ["/clusters/no-such-cluster/", "/clusters/aws-us-east-1/nodes/no-such-node/",
                "/clusters/aws-us-east-1/devices/gpu.nvidia.com/no-pool/gpu-0/", "/claims/ci/no-such-claim/",
                "/inventory/deviceclasses/no.such.class/", "/inventory/slices/aws-us-east-1/no-such-slice/"]:
        resp = client.get(url)
        assert resp.status_code == 404, url


def test_the_overview_aggregate_is_computed_once_per_fleet_state(client, demo, people):
    """Polling the overview does not rescan the fleet, and neither does an allocation or a release: the tally
    follows the rows that changed (tests/frontend/test_overview_tally.py checks it against a full scan)."""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from claims.services.figures.fleet import fleet_overview
    from claims.services.figures.sql import T_DEVICE

    def scans():
        with CaptureQueriesContext(connection) as ctx:
            data = fleet_overview()
        return sum(bool(re.search(rf"\b{T_DEVICE}\b", q["sql"])) for q in ctx.captured_queries), data

    scans()
    again, first = scans()
    assert again == 0  # nothing changed: the remembered aggregate answers
    claim = DeviceAllocation.objects.filter(admin_access=False).first().claim
    from claims.services.claims import release_claim

    release_claim(claim.pk)
    counted, after = scans()
    assert counted == 0 and after["totals"].allocated < first["totals"].allocated
