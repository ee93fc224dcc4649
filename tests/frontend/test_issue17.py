"""Issue 17, "the dashboard": each defect a new user reported, checked on the server side (Django test client).
The browser half (no sideways scrolling, dark-mode contrast, search in the header) is test_browser_issue17.py."""
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.template.loader import render_to_string
from django.test import RequestFactory
from django.utils import timezone

from claims.models import ResourceClaim, UtilisationSnapshot
from claims.services.claims import create_claims, release_claim
from claims.services.utilisation import record_snapshot
from draservice.permissions import readable_namespaces
from draservice.tokens import issue_token
from frontend import demo as demo_mod
from frontend.queries import search as search_q
from frontend.queries import utilisation as util_q
from frontend.views.search import search as search_view
from inventory.models import Cluster, Device, Node
from tests.gangs import fleet as gang_fleet
from tests.gangs.conftest import NS as GANG_NS
from tests.gangs.conftest import rack_fleet  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def static_text(name: str) -> str:
    return Path(finders.find(name)).read_text()


def snapshots(minutes: list[int], now: datetime, total: int = 40, allocated: int = 10) -> None:
    """One snapshot row per minute ago listed (a fresh install's history, with chosen holes)."""
    UtilisationSnapshot.objects.bulk_create(
        UtilisationSnapshot(taken_at=now - timedelta(minutes=m), cluster="c1", driver="gpu.nvidia.com",
                            product="NVIDIA H100", devices_total=total, devices_allocated=allocated)
        for m in minutes)


# ------------------------------------------------------------------------------------------------ utilisation

def test_default_range_shows_the_snapshots_of_a_fresh_install(client, people):
    now = timezone.now()
    snapshots(list(range(1, 21)), now)  # 20 minutes, one a minute
    client.force_login(people["viewer"])
    ctx = client.get("/utilisation/").context
    assert ctx["range"] == "1h" and not ctx["range_chosen"]
    assert ctx["points"] == 20 and ctx["gaps"] == 0  # not "1 points" in an hourly 24 h chart
    assert "the range the snapshots cover" in client.get("/utilisation/").content.decode()
    # Chosen explicitly, 24 h keeps its hourly buckets.
    assert client.get("/utilisation/?range=24h").context["range"] == "24h"
    # A day and more of history: the default is 24 h again; a stopped worker: the range that reaches its last.
    UtilisationSnapshot.objects.all().delete()
    snapshots([60 * 30, 60 * 2], now)
    assert util_q.default_range(now) == "24h"
    UtilisationSnapshot.objects.all().delete()
    snapshots([60 * 24 * 3], now)
    assert util_q.default_range(now) == "7d"
    UtilisationSnapshot.objects.all().delete()
    assert util_q.default_range(now) == "24h"


def test_missing_minutes_are_gaps_and_labels_are_utc_24_hour(client, people):
    now = datetime(2026, 11, 25, 18, 7, 30, tzinfo=UTC)  # 06:07 PM UTC
    minutes = [m for m in range(0, 30) if m not in (10, 11, 12)]
    snapshots(minutes, now)
    data = util_q.utilisation("1h", now=now)
    fleet = data["fleet"]
    assert data["points"] == 27 and data["gaps"] == 3
    nulls = [i for i, v in enumerate(fleet["total"]) if v is None]
    assert len(nulls) == 3 and nulls == list(range(nulls[0], nulls[0] + 3))  # the three missing minutes, in place
    assert fleet["labels"][-1] == "18:07" and all(re.fullmatch(r"\d\d:\d\d|", x) for x in fleet["labels"])
    assert all(v is None for v in (data["by_cluster"]["series"][0]["data"][i] for i in nulls))
    # A week: the date goes with the time, still 24-hour UTC.
    week = util_q.utilisation("7d", now=now)
    assert week["fleet"]["labels"][-1] == "Nov 25 18:00"


def test_a_slower_tick_is_not_a_gap():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    every5 = [t0 + timedelta(minutes=5 * i) for i in range(10)]
    assert None not in util_q.timeline(every5, timedelta(minutes=1))
    holed = every5[:4] + every5[5:]
    assert util_q.timeline(holed, timedelta(minutes=1)).count(None) == 1


def test_charts_draw_straight_segments_break_at_gaps_and_title_their_axes_in_utc():
    js = static_text("frontend/charts.js")
    assert "spanGaps: false" in js and "tension: 0" in js and "time (UTC, 24-hour)" in js
    assert "% of published devices allocated" in js and "devices published" in js
    assert "toLocaleString" not in js  # labels come formatted (UTC) from the server, not in the browser's zone


# ------------------------------------------------------------------------------------------- other defects

def test_try_selector_opened_directly_is_a_whole_page(client, demo, people):
    client.force_login(people["viewer"])
    expr = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'
    resp = client.get("/inventory/try-selector/", {"expression": expr, "class": "gpu.nvidia.com"})
    html = resp.content.decode()
    assert resp.status_code == 200 and "<html" in html and 'class="sidebar"' in html and "app.css" in html
    assert 'data-testid="try-selector-page"' in html and 'data-testid="match-count"' in html
    assert 'data-testid="selector-form"' in html  # and the form, to change the expression
    # htmx (the DeviceClass page's form) still gets just the answer.
    frag = client.post("/inventory/try-selector/", {"expression": expr}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in frag and 'data-testid="match-count"' in frag
    assert "<html" in client.get("/inventory/try-selector/").content.decode()


def test_overview_shows_the_last_inventory_push_and_the_heartbeat_apart(client, demo, people):
    now = timezone.now()
    Cluster.objects.filter(name="aws-us-east-1").update(last_sync_at=now - timedelta(hours=3),
                                                        last_heartbeat_at=now - timedelta(seconds=5))
    client.force_login(people["viewer"])
    html = client.get("/").content.decode()
    row = re.search(r'<tr>\s*<td><a href="/clusters/aws-us-east-1/">.*?</tr>', html, re.S).group(0)
    assert re.search(r'data-testid="last-push"[^>]*>3h ago<', row), row
    assert re.search(r'heartbeat <span data-testid="last-heartbeat"[^>]*>[5-9]s ago<', row), row  # a slow page: 6s
    assert "Inventory push" in html and ">Sync<" not in html
    clusters = client.get("/clusters/").content.decode()
    assert "Inventory push" in clusters and "Last sync" not in clusters


def test_claim_spec_wraps_long_expressions(client, demo, people):
    client.force_login(people["viewer"])
    html = client.get("/claims/ci/b200-job/").content.decode()
    assert '<pre class="wrap-pre" data-testid="spec-yaml">' in html
    css = static_text("frontend/app.css")
    rule = re.search(r"pre\.wrap-pre \{([^}]*)\}", css).group(1)
    assert "white-space: pre-wrap" in rule and "overflow-wrap: anywhere" in rule


def test_gang_boxes_keep_member_names_whole_and_label_their_counts(client, people, rack_fleet):  # noqa: F811
    from gangs.services import gangs as gang_services

    box = {"depth": 0, "label": "rack=r1", "free": 89, "total": 160, "members": 2, "children": [],
           "nodes": [{"name": "n1", "total": 8, "used": 8, "pct": 100, "members": ["member-0", "member-1"]}]}
    html = render_to_string("gangs/partials/domain.html", {"box": box})
    assert "89 of 160 devices free" in html and "89/160" not in html
    assert re.findall(r'<span class="who-name">([^<]+)</span>', html) == ["member-0", "member-1"]
    detail = Path("gangs/templates/gangs/detail.html").read_text()
    assert "break-all" not in detail and "white-space: nowrap" in detail
    # The pending gang's domain table: free and needed in columns of their own, each named.
    gang_services.create_gang(GANG_NS, gang_fleet.gang_body("big", 5))
    client.force_login(people["viewer"])
    page = client.get(f"/gangs/{GANG_NS}/big/").content.decode()
    assert "Free devices in domain" in page and "Devices the gang needs" in page and "Free / needed" not in page


def test_device_counts_agree_with_the_api_and_the_snapshots_and_say_how(client, admin_client, demo, people):
    api = {c["name"]: c["deviceCount"] for c in admin_client.get("/api/v1/clusters?limit=100").json()["results"]}
    record_snapshot()
    latest = UtilisationSnapshot.objects.latest("taken_at").taken_at
    snap = {}
    for s in UtilisationSnapshot.objects.filter(taken_at=latest):
        snap[s.cluster] = snap.get(s.cluster, 0) + s.devices_total
    client.force_login(people["viewer"])
    html = client.get("/").content.decode()
    published = int(re.search(r'data-testid="kpi-devices-published">(\d+)<', html).group(1))
    assert published == sum(api.values()) == sum(snap.values())
    for name, count in api.items():
        page = client.get(f"/clusters/{name}/").content.decode()
        assert f'data-testid="kpi-devices-published">{count}<' in page, name
    # GPUs (units) are fewer than devices where MIG placements are published, and every page says which it counts.
    gpus = int(re.search(r'data-testid="kpi-total">(\d+)<', html).group(1))
    assert gpus < published
    for url in ["/", "/clusters/", "/clusters/aws-us-east-1/", "/utilisation/?range=1h", "/sharing/",
                "/fragmentation/", "/inventory/slices/", "/inventory/pools/"]:
        page = client.get(url).content.decode()
        assert 'data-testid="count-note"' in page and "deviceCount" in page, url
    assert "This page counts <b>devices</b>" in client.get("/utilisation/?range=1h").content.decode()
    assert "This page counts <b>GPUs</b>" in html


def test_dark_mode_follows_the_system_and_has_a_remembered_toggle(client, people):
    client.force_login(people["viewer"])
    html = client.get("/claims/").content.decode()
    assert 'data-testid="theme-toggle"' in html and "localStorage.getItem(\"draservice-theme\")" in html
    css = static_text("frontend/app.css")
    assert "@media (prefers-color-scheme: dark)" in css and ":root[data-theme=dark]" in css
    js = static_text("frontend/theme.js")
    assert "localStorage.setItem" in js


# ------------------------------------------------------------------------------------------------------ search

def test_search_finds_claims_nodes_devices_and_namespaces(client, demo, people, django_assert_max_num_queries):
    client.force_login(people["viewer"])
    html = client.get("/search/", {"q": "ci/b200-job"}).content.decode()
    assert 'href="/claims/ci/b200-job/"' in html
    html = client.get("/search/", {"q": "ci/b200"}).content.decode()  # a prefix after the slash
    assert 'href="/claims/ci/b200-job/"' in html
    html = client.get("/search/", {"q": "b200-job"}).content.decode()  # a bare name, any namespace
    assert 'href="/claims/ci/b200-job/"' in html
    node = Node.objects.select_related("cluster").order_by("name").first()
    html = client.get("/search/", {"q": node.name}).content.decode()
    assert f'href="/clusters/{node.cluster.name}/nodes/{node.name}/"' in html
    dev = Device.objects.filter(attribute_index__has_key="gpu.nvidia.com/uuid").select_related("cluster").first()
    uuid = dev.attribute_index["gpu.nvidia.com/uuid"]
    html = client.get("/search/", {"q": uuid}).content.decode()
    assert f"/devices/{dev.driver}/{dev.pool_name}/{dev.name}/" in html and uuid in html
    html = client.get("/search/", {"q": "inferen"}).content.decode()
    assert 'href="/claims/?namespace=inference"' in html
    assert 'data-testid="no-results"' in client.get("/search/", {"q": "no-such-thing-anywhere"}).content.decode()
    assert client.get("/search/").status_code == 200
    # Cost is bounded: a fixed number of short queries (session, user, and one or two per kind), any fleet size.
    with django_assert_max_num_queries(10):
        client.get("/search/", {"q": uuid})


def test_search_respects_the_namespaces_the_caller_may_read(demo, people):
    """The dashboard applies the API's rule (draservice.permissions.readable_namespaces): a caller scoped to
    namespaces sees only their claims and names; a signed-in dashboard user (staff or not) reads them all."""
    factory = RequestFactory()
    token, _ = issue_token(kind="namespace", name="ci-team", namespaces=["ci"])
    request = factory.get("/search/", {"q": "bert-eval"})
    request.user, request.auth = people["viewer"], token
    assert readable_namespaces(request) == frozenset({"ci"})
    html = search_view(request).content.decode()
    assert "ml-training/bert-eval" not in html and "ml-training" not in html
    html = search_view(_req(factory, "ci/b200-job", people["viewer"], token)).content.decode()
    assert 'href="/claims/ci/b200-job/"' in html
    html = search_view(_req(factory, "ml-training/bert-eval", people["viewer"], token)).content.decode()
    assert "bert-eval" not in html.split('data-testid="search-box"')[1].split("</form>")[1]
    # Without a token, the session user's access: every namespace (as on the claims list).
    html = search_view(_req(factory, "bert-eval", people["viewer"], None)).content.decode()
    assert 'href="/claims/ml-training/bert-eval/"' in html
    assert search_q.search("ml-training/bert-eval", frozenset({"ci"})).claims == []
    assert search_q.search("ml-", frozenset({"ci"})).namespaces == []


def _req(factory, q, user, token):
    r = factory.get("/search/", {"q": q})
    r.user = user
    if token is not None:
        r.auth = token
    return r


# ----------------------------------------------------------------------------------------------------- history

def test_node_and_device_history_show_allocations_over_time(client, demo, people):
    made = create_claims("ml-training", [demo_mod.claim("hist-job", [demo_mod.request("gpu", demo_mod.GPU, 2,
                                                                                       [demo_mod.H100])])])
    claim = ResourceClaim.objects.get(id=made[0].id)
    assert claim.node, claim.message
    devices = list(claim.device_allocations.values_list("driver", "pool", "device"))
    client.force_login(people["viewer"])
    html = client.get(f"/history/nodes/{claim.cluster}/{claim.node}/").content.decode()
    assert 'href="/claims/ml-training/hist-job/"' in html and "still held" in html
    chart = client.get(f"/history/nodes/{claim.cluster}/{claim.node}/").context["chart"]
    assert chart["held"][-1] >= 2 and chart["claims"][-1] >= 1 and chart["held"][0] == 0
    release_claim(claim.id)  # released: its devices now come from the Allocated event
    driver, pool, device = devices[0]
    url = f"/history/devices/{claim.cluster}/{driver}/{pool}/{device}/"
    resp = client.get(url)
    html = resp.content.decode()
    assert resp.status_code == 200 and 'href="/claims/ml-training/hist-job/"' in html and "still held" not in html
    assert resp.context["chart"]["held"][-1] == 1 and max(resp.context["chart"]["claims"]) == 1
    assert client.get(f"/history/nodes/{claim.cluster}/{claim.node}/?range=7d").context["range"] == "7d"
    # Linked from the node and device pages; unknown things are 404s.
    assert "/history/nodes/" in client.get(f"/clusters/{claim.cluster}/nodes/{claim.node}/").content.decode()
    assert url in client.get(f"/clusters/{claim.cluster}/devices/{driver}/{pool}/{device}/").content.decode()
    assert client.get(f"/history/devices/{claim.cluster}/{driver}/{pool}/nope/").status_code == 404
    assert client.get("/history/nodes/nope/n1/").status_code == 404


def test_a_partitionable_gpus_history_gathers_its_partitions(client, demo, people):
    claim = ResourceClaim.objects.get(namespace__name="research", name="mig-pair")
    held = list(claim.device_allocations.values_list("driver", "pool", "device"))
    driver, pool, name = held[0]
    device = Device.objects.get(cluster__name=claim.cluster, driver=driver, pool_name=pool, name=name)
    counter_set = device.consumes_counters[0]["counterSet"]
    client.force_login(people["viewer"])
    url = f"/history/gpus/{claim.cluster}/{driver}/{pool}/{counter_set}/"
    resp = client.get(url)
    html = resp.content.decode()
    assert resp.status_code == 200 and 'href="/claims/research/mig-pair/"' in html and "Partitionable GPU" in html
    same_gpu = sum(1 for d in held if d[:2] == (driver, pool))
    assert resp.context["chart"]["held"][-1] >= same_gpu >= 1
    assert url in client.get(f"/clusters/{claim.cluster}/nodes/{claim.node}/").content.decode()
    assert client.get(f"/history/gpus/{claim.cluster}/{driver}/{pool}/no-such-set/").status_code == 404
