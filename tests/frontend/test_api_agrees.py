"""The device API and the dashboard tell the same story about every device of the demo fleet: which claims
hold it (free / allocated / shared, the lab GPU's shares included) and which DeviceTaintRules taint it."""
import pytest

from claims.services.figures.units import BLOCKING_EFFECTS
from frontend.queries.nodes import build_views
from inventory.models import Cluster, Device

pytestmark = pytest.mark.django_db(transaction=True)


def api_devices(client) -> dict:
    out, url = {}, "/api/v1/devices?limit=5000"
    while url:
        page = client.get(url).json()
        out.update({(d["cluster"], d["driver"], d["pool"], d["name"]): d for d in page["results"]})
        url = page["next"]
    return out


def test_allocation_states_and_rule_taints_agree_with_the_dashboard(admin_client, demo):
    listed = api_devices(admin_client)
    states = {"free": 0, "allocated": 0, "shared": 0}
    for cluster in Cluster.objects.all():
        for view in build_views(cluster, list(Device.objects.filter(cluster=cluster))):
            d = view.device
            api = listed[(cluster.name, d.driver, d.pool_name, d.name)]
            expected = view.state if view.holders else "free"
            assert api["allocation"]["state"] == expected, (d, api["allocation"], view.holders)
            holders = sorted(h.name for h in view.holders)
            assert sorted(c["name"] for c in api["allocation"].get("claims", [])) == holders
            rules = sorted(t["source"]["name"] for t in api["taints"] if "source" in t
                           and t["effect"] in BLOCKING_EFFECTS)
            assert rules == sorted(t["rule"] for t in view.taints if "rule" in t), d
            states[expected] += 1
    # The demo has each kind: whole GPUs, a claim shared by three consumers, and two claims' shares of one GPU.
    assert states["allocated"] and states["shared"] >= 2 and states["free"]
    shared_names = {c["name"] for d in listed.values() if d["allocation"]["state"] == "shared"
                    for c in d["allocation"]["claims"]}
    assert {"shared-l4", "notebook-a", "notebook-b"} <= shared_names
    assert [d["name"] for d in listed.values() if any(t.get("source", {}).get("name") == "xid-79-rma"
                                                      for t in d["taints"])]
