"""The real kubectl 1.32 reads the door's structural OpenAPI v3: explain walks every field, and a typo in a
draservice.io kind is refused before anything is stored (kubectl sends fieldValidation=Strict because the
documents declare it, and the server checks the body against the same definitions)."""
from __future__ import annotations

import yaml


def test_explain_prints_the_fields_of_a_request_and_the_queue_status(kubectl):
    exactly = kubectl("explain", "resourceclaim.spec.devices.requests.exactly").stdout
    assert "A request for devices that must all match it." in exactly
    for line in ("deviceClassName\t<string> -required-", "selectors\t<[]Object>", "count\t<integer>",
                 "allocationMode\t<string>", "adminAccess\t<boolean>"):
        assert line in exactly
    place = kubectl("explain", "resourceclaim.status.positionInQueue").stdout
    assert "FIELD: positionInQueue <integer>" in place and "1-based place" in place
    quotas = kubectl("explain", "queues.spec.quotas", "--api-version=draservice.io/v1alpha1").stdout
    assert "GROUP:      draservice.io" in quotas and "deviceClassName\t<string> -required-" in quotas
    older = kubectl("explain", "resourceclaims.spec.devices.requests", "--api-version=resource.k8s.io/v1beta1")
    assert "deviceClassName\t<string>" in older.stdout and "exactly" not in older.stdout


def test_a_typo_in_a_queue_is_refused_and_nothing_is_stored(kubectl):
    manifest = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "schema-typo"},
                "spec": {"namespaces": ["schema-typo"], "quotas": [{"deviceClassName": "gpu.nvidia.com",
                                                                    "devics": {"nominal": 2}}]}}
    refused = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest), check=False)
    assert refused.returncode == 1
    assert 'strict decoding error: unknown field "spec.quotas[0].devics"' in refused.stderr
    assert "openapi" not in refused.stderr
    missing = kubectl("get", "queue", "schema-typo", check=False)
    assert missing.returncode == 1 and 'queues.draservice.io "schema-typo" not found' in missing.stderr
