"""The Reservations timeline in headless Chromium: a daily reservation's five remaining windows are drawn."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.claims.fleet import load_fleet
from tests.frontend.conftest import login, page, people  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_timeline_shows_the_five_daily_windows(page, live_server, people, admin_client):  # noqa: F811
    load_fleet({"c1": [("h100", 1)]})
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    window = {"start": start.strftime("%Y-%m-%dT%H:%M:%S"), "end": (start + timedelta(hours=4))
              .strftime("%Y-%m-%dT%H:%M:%S"), "timeZone": "UTC",
              "recurrence": {"frequency": "Daily", "until": (start + timedelta(days=4)).strftime("%Y-%m-%d")}}
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Reservation", "metadata": {"name": "nightly"},
            "spec": {"window": window, "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 4}],
                     "users": {"namespaces": ["training"]}}}
    assert admin_client.post("/api/v1/reservations", body, format="json").status_code == 201
    login(page, live_server, "viewer")
    page.goto(f"{live_server.url}/queues/reservations/")
    row = page.locator("[data-testid=reservation-row][data-reservation=nightly]")
    bars = row.get_by_test_id("reservation-window")
    assert bars.count() == 5
    lefts = [float(bars.nth(i).evaluate("e => e.getBoundingClientRect().left")) for i in range(5)]
    widths = [float(bars.nth(i).evaluate("e => e.getBoundingClientRect().width")) for i in range(5)]
    gaps = [b - a for a, b in zip(lefts, lefts[1:], strict=False)]
    # One a day, evenly spaced (a day is 1/7 of the timeline), each 4 hours wide (1/6 of a day).
    assert max(gaps) - min(gaps) < 2 and all(abs(w - gaps[0] / 6) < 2 for w in widths), (gaps, widths)
    assert "gpu.nvidia.com × 4" in row.inner_text() and "0 / 4" in row.inner_text()
