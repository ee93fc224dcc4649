"""The Fragmentation page's defragmentation advice in headless Chromium: the plan is shown, an operator
applies it, the agent confirms the old claims' release, and the 8-GPU claim it made room for is then allocated
by the ordinary claims round."""
import pytest

from claims.models import Phase, ResourceClaim
from claims.placement import ALLOWED_CLUSTERS, NODE_PIN
from claims.services import claims as claim_services
from claims.services.claims import release_claim
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim, load_fleet
from tests.frontend.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

N0, N1 = "c1-h100-000", "c1-h100-001"


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def seed() -> None:
    """Two 8xH100 nodes: two 1-GPU claims on node 0, a 6-GPU claim on node 1, an 8-GPU claim pending."""
    load_fleet({"c1": [("h100", 2)]})
    pin = {ALLOWED_CLUSTERS: "name=c1"}
    claim_services.create_claims("team-a", [gpu_claim("one-a", annotations={**pin, NODE_PIN: N0}),
                                            gpu_claim("one-b", annotations={**pin, NODE_PIN: N0})])
    claim_services.create_claims("team-b", [gpu_claim("six", count=6, annotations={**pin, NODE_PIN: N1})])
    run_rounds()
    for c in ResourceClaim.objects.all():  # the seeding pins go: a claim its owner pinned is never moved
        claim_services.update_claim(c.id, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                           "metadata": {"name": c.name, "annotations": {}}})
    claim_services.create_claims("team-c", [gpu_claim("eight", count=8)])
    run_rounds()


def test_fragmentation_page_shows_the_plan_and_applying_it_lets_the_8_gpu_claim_allocate(page, live_server, people):
    seed()
    eight = ResourceClaim.objects.get(name="eight")
    assert eight.phase == Phase.PENDING

    login(page, live_server, "viewer")  # read-only: sees the plan, no button
    page.goto(f"{live_server.url}/fragmentation/")
    plans = page.get_by_test_id("plans")
    assert "move 2 claims (single GPU) from c1/c1-h100-000" in plans.inner_text()
    assert "team-a/one-a" in plans.inner_text() and "c1/c1-h100-001" in plans.inner_text()
    assert page.get_by_test_id("apply-plan").count() == 0
    page.context.clear_cookies()

    login(page, live_server, "ops")
    page.goto(f"{live_server.url}/fragmentation/")
    page.on("dialog", lambda d: d.accept())
    page.get_by_test_id("apply-plan").click()
    page.wait_for_url(f"{live_server.url}/fragmentation/")
    assert "applied" in page.locator(".messages").inner_text()
    assert page.get_by_test_id("no-plans").is_visible()
    run_rounds()
    eight.refresh_from_db()
    assert eight.phase == Phase.PENDING  # the old claims still hold node 0 (condition Releasing)
    for old in ResourceClaim.objects.filter(name__in=["one-a", "one-b"]):
        release_claim(old.id)  # what the cluster's agent does once no pod uses them (its confirmation)

    run_rounds()
    eight.refresh_from_db()
    assert eight.phase == Phase.ALLOCATED and eight.node == N0
    assert len(eight.allocation["devices"]["results"]) == 8
    moved = ResourceClaim.objects.filter(phase=Phase.ALLOCATED, namespace__name="team-a")
    plan_id = moved[0].annotations["draservice.io/defrag-plan"]
    assert sorted(c.name for c in moved) == [f"one-a-m{plan_id[:8]}", f"one-b-m{plan_id[:8]}"]
    assert sorted(c.node for c in moved) == [N1, N1]
