"""The Usage page in headless Chromium: the stacked chart draws, the table shows cost, the CSV link downloads."""
from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from tests.frontend.conftest import login, page, people  # noqa: F401 (fixtures)
from usage.models import Price, UsageInterval

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def interval(namespace: str, hours_ago: float, hours: float, weight: str = "1") -> UsageInterval:
    now = timezone.now()
    return UsageInterval(claim_id=1, claim_uid=uuid.uuid4(), claim_name="c", namespace=namespace, cluster="c1",
                         node="n1", driver="gpu.nvidia.com", pool="n1", device="gpu-0", product="H100",
                         sharing="exclusive", weight=Decimal(weight), started_at=now - timedelta(hours=hours_ago),
                         ended_at=now - timedelta(hours=hours_ago - hours))


def test_the_usage_page_draws_and_exports(page, live_server, people):  # noqa: F811
    UsageInterval.objects.bulk_create([interval("team-a", 30, 10), interval("team-b", 5, 2, "0.5")])
    Price.objects.create(product="H100", currency="EUR", per_device_hour=Decimal("2"))
    login(page, live_server, "viewer")
    page.click("nav >> text=Usage")
    page.wait_for_selector("body[data-charts-ready=true]")
    rows = page.locator("[data-testid=usage-row]")
    assert rows.count() == 2
    assert "20.00 EUR" in rows.nth(0).inner_text() and "2.00 EUR" in rows.nth(1).inner_text()
    with page.expect_download() as download:
        page.click("[data-testid=usage-csv]")
    text = Path(download.value.path()).read_text()
    assert text.splitlines()[0].startswith("namespace,product,deviceHours") and "team-a,H100,10.0" in text
