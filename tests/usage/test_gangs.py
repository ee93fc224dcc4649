"""Gang placements reach the ledger through the one commit service, and a gang's release and deletion close
its intervals (which outlive the gang's claims)."""
from __future__ import annotations

import pytest

from tests.gangs import fleet
from tests.gangs.conftest import NS, rack_fleet  # noqa: F401 (a fixture)
from tests.usage.conftest import assert_ledger_matches_allocations
from usage.models import UsageInterval

pytestmark = pytest.mark.django_db(transaction=True)  # placement runs after commit, as in production
URL = f"/api/v1/namespaces/{NS}/gangs"


def test_a_gangs_intervals_open_with_its_placement_and_close_with_its_release(admin_client, rack_fleet):  # noqa: F811
    assert admin_client.post(URL, fleet.gang_body("job", 3, timeout=600), format="json").status_code == 201
    assert UsageInterval.objects.filter(ended_at__isnull=True, namespace=NS).count() == 24
    assert_ledger_matches_allocations()
    assert admin_client.post(f"{URL}/job/release").status_code == 200
    assert UsageInterval.objects.filter(ended_at__isnull=True).count() == 0
    assert admin_client.delete(f"{URL}/job").status_code == 200
    assert UsageInterval.objects.count() == 24  # the ledger outlives the gang and its claims
    assert_ledger_matches_allocations()
