"""The dashboard's Queues page: the tree with use against nominal, pending claims, shares."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, rounds, submit

pytestmark = pytest.mark.django_db


def test_queues_page_shows_the_tree_use_and_waiting(admin_client, h100_fleet):
    make(admin_client, queue_body("org"), queue_body("team-a", parent="org", namespaces=["a"], gpus=2))
    for i in range(3):
        submit(admin_client, "a", f"c{i}")
    submit(admin_client, "a", "huge", 16)
    rounds(1)
    client = Client()
    assert client.get("/queues/").status_code == 302  # logged-in people only
    client.force_login(User.objects.create_user("viewer"))
    html = client.get("/queues/").content.decode()
    assert 'href="/queues/"' in html  # in the navigation
    rows = html.split('data-testid="queue-row"')[1:]
    names = [r.split("<b>")[1].split("</b>")[0] for r in rows]
    assert names == ["default", "org", "team-a"]  # the tree, children under their parent
    team = rows[2]
    assert "padding-left: 26px" in team  # indented one level
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in team.split('<td class="num"')[1:]]
    assert cells[:4] == ["2", "3", "1", "0"]  # nominal, in use, borrowed, lent
    assert cells[4] == "1"  # pending: the claim that fits nowhere
    assert 'id="q-team-a"' in team and re.search(r">#[1-3] · ", team)  # an anchor for claim pages; the rank
    head = team.split('data-testid="queue-head">')[1].split("</td>")[0]
    assert "/claims/a/huge/" in head  # the head of the queue, linked
