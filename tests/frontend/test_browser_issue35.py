"""Issue 35 in a real browser (headless Debian Chromium): the dashboard counts accelerators right and shows the
queue, on the demo fleet with its workload and a queue whose claim waits for quota.

One live server and one logged-in browser context for the whole module (the fleet is loaded once, committed,
and flushed at the end), so the pages are what a person sees after ``make run``.
"""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services.claims import create_claims
from frontend import demo as demo_mod
from inventory.models import Device, Node
from queues.services.queues import create_queue
from tests.frontend.conftest import PASSWORD
from tests.queues.conftest import queue_body
from workloads.services import workloads as workload_services

# The marker makes pytest-django set up the test database (it sets up only the databases marked tests use); the
# module's data is committed by ``site`` and read by the live server's own connections.
pytestmark = [pytest.mark.browser, pytest.mark.django_db]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
LONG_NUMBER = re.compile(r"\b\d{10,}\b")
# A UUID's last group is 12 hex digits, all of them decimal now and then: not a number anyone should read.
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)


def _accelerators() -> int:
    """The fleet's accelerators counted independently: counter sets, plus standalone devices of the demo's
    GPU kinds (the classes marked ``draservice.io/accelerator``: NVIDIA GPUs, AMD, Intel, example GPUs)."""
    sets, whole = set(), 0
    for d in Device.objects.select_related("cluster").only("cluster__name", "driver", "pool_name", "name",
                                                         "consumes_counters", "attributes"):
        if d.consumes_counters:
            sets.add((d.cluster.name, d.driver, d.pool_name, d.consumes_counters[0]["counterSet"]))
        elif d.driver in ("gpu.amd.com", "gpu.intel.com", "gpu.example.com") or (
                d.driver == "gpu.nvidia.com" and (d.attributes.get("type") or {}).get("string") == "gpu"):
            whole += 1
    return len(sets) + whole


def _build() -> dict:
    from django.contrib.auth.models import User
    from pytest_django.live_server_helper import LiveServer

    demo_mod.load_fleet(nodes=24)
    names = demo_mod.build_workload()
    # team-c may use 2 H100s and borrow nothing: q-run holds them (a 20-minute lease), q-wait waits for quota.
    create_queue(queue_body("team-c", namespaces=["ci-q"], gpus=2, borrowing=0))
    create_claims("ci-q", [demo_mod.claim("q-run", [demo_mod.request("gpus", demo_mod.GPU, 2, [demo_mod.H100])])])
    ResourceClaim.objects.filter(name="q-run").update(lease_expires_at=timezone.now() + timedelta(minutes=20))
    create_claims("ci-q", [demo_mod.claim("q-wait", [demo_mod.request("gpu", demo_mod.GPU, 1, [demo_mod.H100])])])
    # team-m has a MIG memory quota: the Queues page shows it (and what its claim uses) in Gi, not in bytes.
    create_queue(queue_body("team-m", namespaces=["mig-q"], quotas=[{
        "deviceClassName": demo_mod.MIG, "devices": {"nominal": 2}, "counters": {"memory": {"nominal": "40Gi"}}}]))
    profile = 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    create_claims("mig-q", [demo_mod.claim("m-one", [demo_mod.request("mig", demo_mod.MIG, 1, [profile])])])
    # A PodGroup that has no pods yet: no gang, but the Gangs page must show it.
    workload_services.create("ml-training", "PodGroup", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "train"},
        "spec": {"minMember": 4}})
    User.objects.create_user("viewer", "viewer@example.com", PASSWORD)
    full = ResourceClaim.objects.get(namespace__name="ml-training", name="llama-finetune")
    d = Device.objects.filter(cluster__name=names["mig_node"][0], node_name=names["mig_node"][1]) \
        .exclude(consumes_counters=[]).first()
    return {**names, "full_node": (full.cluster, full.node), "accelerators": _accelerators(),
            "nodes": Node.objects.count(),
            "nvidia_gpus": Device.objects.filter(driver="gpu.nvidia.com", attributes__type__string="gpu").count(),
            "mig_device": d, "server": LiveServer("localhost"),
            "wait_reason": ResourceClaim.objects.get(name="q-wait").reason,
            "q_wait_phase": ResourceClaim.objects.get(name="q-wait").phase}


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        built = _build()
    yield built
    built["server"].stop()
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)
        # A connection the live server's threads left open would keep the test database from being dropped
        # at the end of the session (this process's own database: nobody else uses it).
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        connection.close()  # and this one: the teardown may run in another context than the one dropping it


@pytest.fixture(scope="module")
def session(site, browser, django_db_blocker):
    """One logged-in context; every response and console message of its pages is recorded."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    log = {"errors": [], "bad": []}
    page.on("console", lambda m: m.type == "error" and log["errors"].append(m.text))
    page.on("pageerror", lambda exc: log["errors"].append(str(exc)))
    page.on("response", lambda r: r.status >= 400 and log["bad"].append((r.status, r.url)))
    url = site["server"].url
    with django_db_blocker.unblock():  # the live server's thread reads the database too
        page.goto(f"{url}/login/")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{url}/")
    yield page, url, log
    context.close()


def test_the_numbers_are_the_fleets(session, site):
    page, url, log = session
    assert (site["q_wait_phase"], site["wait_reason"]) == (Phase.PENDING, "WaitingForQuota")
    # The overview's GPU total is the fleet's accelerators: no helper devices, no "(no product name)" NVIDIA row.
    page.goto(f"{url}/")
    assert int(page.get_by_test_id("kpi-total").inner_text().replace(",", "")) == site["accelerators"]
    # The H100 node whose 8 GPUs llama-finetune holds: 0 free (its 2 compute-domain devices are helpers).
    cluster, node = site["full_node"]
    page.goto(f"{url}/clusters/{cluster}/nodes/{node}/")
    counts = page.get_by_test_id("node-counts")
    assert counts.locator("[data-state=free]").inner_text() == "0 free"
    assert counts.locator("[data-state=allocated]").inner_text() == "8 allocated"
    assert counts.get_by_test_id("helper-devices").inner_text() == "2 helper devices"
    # Fragmentation counts each node once.
    page.goto(f"{url}/fragmentation/")
    assert page.get_by_test_id("frag-nodes").text_content() == f"{site['nodes']} nodes with GPUs"
    # The 16-H100 claim fits on no node: the free NVIDIA GPUs are stranded by placement. q-wait waits for
    # quota, which is told apart.
    assert int(page.get_by_test_id("stranded-total").inner_text()) > 0
    assert page.get_by_test_id("waiting-for-quota").inner_text().startswith("1 pending claim waits for quota")
    assert not log["errors"] and not log["bad"], log


def test_a_claim_waiting_for_quota_shows_its_queue(session, site):
    page, url, log = session
    page.goto(f"{url}/claims/ci-q/q-wait/")
    box = page.get_by_test_id("claim-queue")
    assert box.get_by_test_id("queue-link").inner_text() == "team-c"
    assert box.get_by_test_id("queue-position").inner_text() == "position 1"
    assert re.search(r"expected to start in about (1[5-9]|20)m \(\d\d:\d\d UTC\)", box.get_by_test_id("queue-eta")
                     .inner_text()), box.inner_text()
    # The claims list has the queue too, linked to its row on the Queues page.
    page.goto(f"{url}/claims/?namespace=ci-q")
    row = page.get_by_test_id("claim-row").filter(has_text="q-wait")
    assert re.fullmatch(r"team-c\s+#1 · ~(1[5-9]|20)m", row.get_by_test_id("claim-queue").inner_text())
    row.get_by_test_id("claim-queue").get_by_role("link", name="team-c").click()
    assert page.url.endswith("/queues/#q-team-c")
    team = page.locator("#q-team-c")
    assert "ci-q/q-wait" in team.get_by_test_id("queue-head").inner_text()
    text = page.get_by_test_id("queues-table").inner_text()
    memory = page.locator("#q-team-m").locator("xpath=following-sibling::tr[1]")
    assert re.search(r"mig\.nvidia\.com · memory\s+40Gi\s+(0|\d+(\.\d)?Gi)\s", memory.inner_text()), memory.inner_text()
    assert not LONG_NUMBER.search(UUID.sub("", text)), text
    assert not log["errors"] and not log["bad"], log


def test_device_classes_say_how_many_devices_they_match(session, site):
    page, url, log = session
    page.goto(f"{url}/inventory/deviceclasses/")
    rows = page.get_by_test_id("deviceclasses").locator("tbody tr")
    # No vfio devices in the demo fleet: that class is flagged; the GPU class matches every NVIDIA GPU.
    vfio = rows.filter(has_text="vfio.gpu.nvidia.com")
    assert vfio.get_by_test_id("class-matches").inner_text() == "⚠ 0 devices"
    gpus = rows.filter(has=page.get_by_role("link", name="gpu.nvidia.com", exact=True))
    assert int(gpus.get_by_test_id("class-matches").inner_text()) == site["nvidia_gpus"]
    assert "accelerator" in gpus.inner_text() and "accelerator" not in vfio.inner_text()
    assert not log["errors"] and not log["bad"], log


def test_the_gangs_page_lists_pod_groups(session):
    page, url, log = session
    page.goto(f"{url}/gangs/")
    assert "1 PodGroup or Workload below has not formed one" in page.get_by_test_id("gangs-table").inner_text()
    row = page.get_by_test_id("podgroup-row")
    assert row.count() == 1 and re.fullmatch(r"train\s+ml-training\s+PodGroup\s+0 / min 4\s+not formed yet\s+\S+ ago",
                                             row.inner_text().strip()), row.inner_text()
    assert not log["errors"] and not log["bad"], log


def test_times_are_for_people(session):
    page, url, log = session
    page.goto(f"{url}/usage/")
    for testid in ("usage-since", "usage-until"):  # not the API's ISO form with microseconds
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", page.get_by_test_id(testid).inner_text())
    page.goto(f"{url}/claims/ml-training/llama-finetune/")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC, after \d+\.\d s",
                        page.get_by_test_id("allocated-at").inner_text())
    assert not log["errors"] and not log["bad"], log


def pages(site) -> list[str]:
    d = site["mig_device"]
    mig_cluster, mig_node = site["mig_node"]
    lab_cluster, lab_node = site["lab_node"]
    gpu = f"{d.cluster.name}/{d.driver}/{d.pool_name}/{d.consumes_counters[0]['counterSet']}"
    key = f"{d.cluster.name}/{d.driver}/{d.pool_name}/{d.name}"
    return [
        "/", "/utilisation/", "/clusters/", "/clusters/aws-us-east-1/", f"/clusters/{mig_cluster}/nodes/{mig_node}/",
        f"/clusters/{lab_cluster}/nodes/{lab_node}/", f"/clusters/{d.cluster.name}/devices/{d.driver}/{d.pool_name}/"
        f"{d.name}/", "/sharing/", "/fragmentation/", "/claims/", "/claims/ci-q/q-wait/", "/claims/ci/b200-job/",
        "/claims/research/mig-pair/", "/inventory/slices/", "/inventory/pools/", "/inventory/deviceclasses/",
        "/inventory/deviceclasses/gpu.nvidia.com/", "/inventory/taintrules/", "/inventory/try-selector/",
        "/search/?q=ci/", f"/history/nodes/{mig_cluster}/{mig_node}/", f"/history/devices/{key}/",
        f"/history/gpus/{gpu}/", "/gangs/", "/queues/", "/usage/",
    ]


def _sweep(page, url: str, log: dict, urls: list[str], widths: tuple, themes: tuple) -> list:
    problems = []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for theme in themes:
        page.emulate_media(color_scheme=theme)
        for width in widths:
            page.set_viewport_size({"width": width, "height": 900})
            for path in urls:
                log["errors"].clear()
                log["bad"].clear()
                resp = page.goto(url + path)
                where = (theme, width, path)
                if resp.status != 200:
                    problems.append((*where, "status", resp.status))
                sizes = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
                if sizes[0] > sizes[1]:
                    problems.append((*where, "overflow", sizes))
                found = LONG_NUMBER.findall(UUID.sub("", page.inner_text("main")))
                if found:
                    problems.append((*where, "long number", found[:3]))
                if log["errors"] or log["bad"]:
                    problems.append((*where, "errors", list(log["errors"]), list(log["bad"])))
                name = re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "overview"
                page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}-{theme}.png"))
    return problems


def test_the_favicon_is_served(session):
    page, url, _ = session
    resp = page.request.get(f"{url}/favicon.ico")
    assert resp.status == 200 and resp.headers["content-type"].startswith("image/")


def test_every_page_at_800_px_in_dark_mode(session, site):
    """The reduced sweep: every page once, narrow and dark (the full one below is `make test-long`'s)."""
    page, url, log = session
    assert not _sweep(page, url, log, pages(site), (800,), ("dark",))


@pytest.mark.long
def test_every_page_at_both_widths_in_both_themes(session, site):
    page, url, log = session
    assert not _sweep(page, url, log, pages(site), (800, 1400), ("light", "dark"))
