"""The dashboard in a real browser: headless Debian Chromium driving the live server, real PostgreSQL, the demo
fleet and claims allocated by the real engine (see conftest.py and frontend.demo)."""
import re

import pytest

from claims.models import Phase, ResourceClaim
from claims.services.claims import release_claim
from inventory.models import Device
from tests.frontend.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_log_in_and_see_the_fleet(page, live_server, people, demo):
    page.goto(f"{live_server.url}/")
    assert "/login/" in page.url  # everything needs a login
    page.fill("#id_username", "viewer")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    assert page.get_by_role("alert").inner_text().startswith("Wrong username or password")

    login(page, live_server, "viewer")
    assert page.get_by_test_id("whoami").inner_text().endswith("read-only")
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING).count()
    assert page.get_by_test_id("kpi-pending").inner_text() == str(pending)
    assert int(page.get_by_test_id("kpi-allocated").inner_text()) > 0
    assert int(page.get_by_test_id("kpi-shared").inner_text()) >= 2
    # The oldest wait is shown and links to a pending claim.
    assert re.fullmatch(r"\d+[smhd].*", page.get_by_test_id("oldest-wait").inner_text())
    # Every cluster is listed, the silent one flagged with its sync age.
    rows = page.get_by_test_id("by-cluster").locator("tbody tr")
    assert rows.count() == 5
    stale = page.get_by_test_id("stale-clusters")
    assert demo["stale_cluster"] in stale.inner_text() and "last inventory push 1h" in stale.inner_text()
    assert "NVIDIA H100 80GB HBM3" in page.get_by_test_id("by-product").inner_text()
    # The live part polls the same URL through htmx and swaps in the fragment the server returns for it. Fire
    # the request htmx's poll makes (rather than wait 15 s) and check that a fragment, not a page, comes back.
    assert page.locator("#live").get_attribute("hx-trigger") == "every 15s"
    release_claim(ResourceClaim.objects.get(namespace__name="ci", name="b200-job").id)
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true") as resp:
        page.evaluate("htmx.ajax('GET', '/', {target: '#live', swap: 'innerHTML'})")
    assert "<html" not in resp.value.text() and 'data-testid="kpis"' in resp.value.text()
    page.wait_for_function(f"document.querySelector('[data-testid=kpi-pending]').innerText == '{pending - 1}'")
    assert page.locator("[data-testid=kpis]").count() == 1  # swapped in place, not nested


def test_open_a_node_with_mig_partitions(page, live_server, people, demo):
    login(page, live_server, "viewer")
    cluster, node = demo["mig_node"]
    # Drill down the way a person does: clusters -> cluster -> node.
    page.get_by_role("link", name="Clusters & nodes").click()
    page.get_by_role("link", name=cluster, exact=True).first.click()
    page.fill("#q", node)
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name=node).click()
    assert page.url.endswith(f"/clusters/{cluster}/nodes/{node}/")
    gpus = page.get_by_test_id("counter-set")
    assert gpus.count() == 8
    split = gpus.filter(has_text="3g.40gb").filter(has=page.locator(".cell.allocated, .cell.shared"))
    assert split.count() >= 1
    gpu = split.first
    cells = gpu.get_by_test_id("memory-slices").locator(".cell")
    block = gpu.locator(".cell", has_text="3g.40gb").first
    assert "span 4" in block.get_attribute("style")
    free = gpu.get_by_test_id("memory-slices").locator(".cell.free").count()
    assert 0 < free < 8 and cells.count() < 8  # partitions drawn over several slices, the rest free
    # Click the partition: its device page shows who holds it and the GPU it is cut from.
    block.locator("a").click()
    assert page.get_by_test_id("device-state").inner_text() in ("allocated", "shared")
    assert "research" in page.get_by_test_id("holders").inner_text()
    assert page.get_by_test_id("counter-set").count() == 1


def test_open_a_shared_device(page, live_server, people, demo):
    login(page, live_server, "viewer")
    page.get_by_role("link", name="Sharing").click()
    table = page.get_by_test_id("shared-devices")
    row = table.locator("tbody tr", has_text="inference/shared-l4")
    assert "web-0, web-1, web-2" in row.inner_text()
    assert "one claim, several consumers" in row.inner_text()
    lab = table.locator("tbody tr", has_text="lab/notebook-a")
    assert "lab/notebook-b" in lab.inner_text() and "consumable capacity" in lab.inner_text()
    assert "memory 24.0 GiB" in lab.inner_text() and "memory 16.0 GiB" in lab.inner_text()
    row.locator("a.mono").first.click()
    assert page.get_by_test_id("device-state").inner_text() == "shared"
    holders = page.get_by_test_id("holders").inner_text()
    assert all(f"web-{i}" in holders for i in range(3))
    # The consumable-capacity GPU is drawn with one segment per share.
    cluster, node = demo["lab_node"]
    page.goto(f"{live_server.url}/clusters/{cluster}/nodes/{node}/")
    bars = page.get_by_test_id("capbar")
    segs = bars.first.locator("a")
    labels = sorted(segs.all_inner_texts())
    assert labels == ["lab/notebook-a", "lab/notebook-b"]
    widths = [float(re.search(r"width: ([\d.]+)%", s.get_attribute("style")).group(1)) for s in segs.all()]
    assert sorted(round(w) for w in widths) == [20, 30]  # 16Gi and 24Gi of 80Gi


def test_read_the_explanation_of_a_pending_claim(page, live_server, people, demo):
    login(page, live_server, "viewer")
    page.get_by_role("link", name="ResourceClaims").click()
    # Filtering swaps the table in place (htmx) and keeps the filter in the URL.
    page.select_option("#f-phase", "Pending")
    page.wait_for_url(re.compile(r"phase=Pending"))
    rows = page.get_by_test_id("claim-row")
    rows.first.wait_for()
    names = rows.all_inner_texts()
    assert len(names) == ResourceClaim.objects.filter(phase=Phase.PENDING).count()
    assert all("Pending" in n for n in names)

    page.get_by_role("link", name="needs-16-h100").click()
    assert page.get_by_test_id("claim-phase").inner_text() == "Pending"
    explanation = page.get_by_test_id("explanation")
    assert "No node in the fleet can hold this claim" in page.get_by_test_id("headline").inner_text()
    verdict = explanation.get_by_test_id("verdict").inner_text()
    assert "at most 8 on one node" in verdict and "needs 16" in verdict
    assert explanation.get_by_test_id("funnel").is_visible()
    assert "deviceClassName: gpu.nvidia.com" in page.get_by_test_id("spec-yaml").inner_text()
    assert "Created" in page.get_by_test_id("events").inner_text()

    page.go_back()
    page.get_by_role("link", name="b200-job").click()
    miss = page.get_by_test_id("nearest-miss").first.inner_text()
    assert "selector #0" in miss and "Blackwell" in miss
    h100s = Device.objects.filter(attribute_index__contains={"gpu.nvidia.com/architecture": "Hopper"}).count()
    assert int(re.search(r"(\d+) more device", miss).group(1)) > 0 and h100s > 0


def test_try_a_selector(page, live_server, people, demo):
    login(page, live_server, "viewer")
    page.get_by_role("link", name="DeviceClasses").click()
    page.get_by_role("link", name="gpu.nvidia.com", exact=True).click()
    page.fill("#expression", 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"')
    page.get_by_role("button", name="Validate & count matches").click()
    count = page.get_by_test_id("match-count")
    count.wait_for()
    expected = Device.objects.filter(attribute_index__contains={"gpu.nvidia.com/productName": "NVIDIA L4"}).count()
    assert expected > 0 and int(count.inner_text()) == expected
    page.fill("#expression", 'device.attributes["gpu.nvidia.com"].productName ==')
    page.get_by_role("button", name="Validate & count matches").click()
    assert "Invalid CEL" in page.get_by_test_id("selector-invalid").inner_text()


def test_operator_releases_a_claim_from_its_page(page, live_server, people, demo):
    login(page, live_server, "ops")
    page.goto(f"{live_server.url}/claims/ml-training/bert-eval/")
    page.on("dialog", lambda d: d.accept())
    page.get_by_test_id("release").click()
    page.wait_for_load_state()
    assert page.get_by_test_id("claim-phase").inner_text() == "Released"
    assert ResourceClaim.objects.get(namespace__name="ml-training", name="bert-eval").phase == Phase.RELEASED


def test_utilisation_charts_draw(page, live_server, people, demo):
    login(page, live_server, "viewer")
    page.get_by_role("link", name="Utilisation").click()
    page.wait_for_selector("body[data-charts-ready=true]")
    assert page.locator("canvas").count() == 3
    page.get_by_test_id("range-picker").get_by_role("link", name="7d").click()
    assert "range=7d" in page.url
    page.wait_for_selector("body[data-charts-ready=true]")
