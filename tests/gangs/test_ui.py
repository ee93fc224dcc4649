"""The gang pages of the dashboard: the list, and a gang's placement drawn over the rack topology."""
from __future__ import annotations

import re

import pytest

from gangs.models import Gang, GangPhase
from gangs.services import gangs as gang_services
from tests.gangs import fleet
from tests.gangs.conftest import NS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ops(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True))
    return client


def test_list_and_detail_draw_the_placement_over_the_topology(ops, rack_fleet):
    gang_services.create_gang(NS, fleet.gang_body("train", 4))
    gang_services.create_gang(NS, fleet.gang_body("big", 5))
    html = ops.get("/gangs/").content.decode()
    assert html.count('data-testid="gang-row"') == 2 and "NoDomainFits" in html

    html = ops.get(f"/gangs/{NS}/train/").content.decode()
    assert 'data-testid="gang-phase">Placed' in html
    # The rack box that holds the gang is outlined as its domain; its four nodes carry the members.
    marked = re.findall(r'data-mark="domain">\s*<div class="topo-head"><span class="mono">([^<]+)<', html)
    assert marked == ["rack=rack-a1"]
    members = re.findall(r'class="topo-node member"[^>]*data-node="([^"]+)"', html)
    assert sorted(members) == sorted(g.node for g in Gang.objects.get(name="train").members.all())
    assert len(re.findall(r'data-testid="topo-node"', html)) == 9  # every node of the cluster is drawn

    html = ops.get(f"/gangs/{NS}/big/").content.decode()
    assert 'data-mark="closest"' in html and 'data-testid="domains"' in html and "rack-a1" in html
    assert ops.get(f"/gangs/{NS}/nope/").status_code == 404


def test_operators_release_and_viewers_cannot(ops, client, rack_fleet, django_user_model):
    gang_services.create_gang(NS, fleet.gang_body("job", 2))
    resp = ops.post(f"/gangs/{NS}/job/release/")
    assert resp.status_code == 302 and Gang.objects.get(name="job").phase == GangPhase.RELEASED
    gang_services.create_gang(NS, fleet.gang_body("job2", 2))
    client.force_login(django_user_model.objects.create_user("viewer", "v@example.com", "pw"))
    assert client.post(f"/gangs/{NS}/job2/release/").status_code == 403
    assert 'data-testid="release"' not in client.get(f"/gangs/{NS}/job2/").content.decode()
    assert Gang.objects.get(name="job2").phase == GangPhase.PLACED
    client.logout()
    assert client.get("/gangs/").status_code == 302  # to the login page
