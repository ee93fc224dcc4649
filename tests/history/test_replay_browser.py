"""The Replays pages in headless Chromium: an admin starts a what-if from the navigation's Replays page (queue b's
weight 3) and, on the finished replay's page, reads the comparison per queue that the API gives."""
from __future__ import annotations

import os
import re

import pytest

from tests.frontend.conftest import login, page, people  # noqa: F401 (fixtures)
from tests.history.trace import recorded_day

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STAMP = "%Y-%m-%dT%H:%M:%SZ"


def test_an_admin_starts_a_what_if_and_reads_the_comparison(page, live_server, people, admin_client):  # noqa: F811
    start, end = recorded_day(admin_client)
    login(page, live_server, "ops")
    page.get_by_test_id("nav-replays").click()
    page.wait_for_url(f"{live_server.url}/replays/")
    page.get_by_test_id("replay-start").fill(start.strftime(STAMP))
    page.get_by_test_id("replay-end").fill(end.strftime(STAMP))
    page.get_by_label("weight of b in the replay").fill("3")
    page.get_by_test_id("replay-submit").click()
    # No broker and no runner in the live server: the replay ran when it was asked for, so the page it lands on
    # is a finished replay's.
    page.wait_for_url(re.compile(rf"{re.escape(live_server.url)}/replays/[0-9a-f-]{{36}}/$"))
    name = page.url.rstrip("/").rsplit("/", 1)[1]
    assert page.get_by_test_id("replay-state").inner_text() == "Succeeded"
    results = admin_client.get(f"/api/v1/replays/{name}").json()["status"]["results"]
    table = page.get_by_test_id("replay-comparison")
    assert table.is_visible()
    for q in results["queues"]:
        row = table.locator(f"tr[data-queue={q['name']}]")
        shares = [row.locator("td[data-cell=share]").nth(i).inner_text() for i in range(2)]
        assert shares == [f"{q[side]['shareOfDeviceHours'] * 100:.2f} %" for side in ("actual", "replayed")]
        hours = [row.locator("td[data-cell=deviceHours]").nth(i).inner_text() for i in range(2)]
        assert hours == [str(q[side]["deviceHours"]) for side in ("actual", "replayed")]
    b = table.locator("tr[data-queue=b]")
    assert b.locator("td[data-cell=p50]").first.inner_text() == "2h 30m"  # what happened: 3 h and 2 h waits
    assert page.get_by_test_id("override-row").inner_text().split("\t") == ["Queue", "b", '{"weight": 3}']
    # The table fits a laptop screen's card (it scrolls inside the card rather than widening the page).
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1366, width
    if os.environ.get("SCREENSHOTS"):
        page.screenshot(path=os.environ["SCREENSHOTS"], full_page=True)
