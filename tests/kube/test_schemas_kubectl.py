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


def test_half_life_is_explained_and_kubectl_changes_are_audited(kubectl, kube_service):
    """``spec.fairSharing`` in explain; a bad half-life refused at its field; two weight patches and a dry run
    through kubectl: two audit events by the admin token, the dry run none."""
    explained = kubectl("explain", "queues.spec.fairSharing", "--api-version=draservice.io/v1alpha1").stdout
    assert "halfLifeSeconds\t<integer>" in explained
    manifest = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "audited"},
                "spec": {"namespaces": ["audited"], "fairSharing": {"halfLifeSeconds": -5}}}
    refused = kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest), check=False)
    assert refused.returncode == 1 and "spec.fairSharing.halfLifeSeconds" in refused.stderr
    manifest["spec"]["fairSharing"]["halfLifeSeconds"] = 3600
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    for weight in (2, 3):
        kubectl("patch", "queue", "audited", "--type=merge", "-p", f'{{"spec":{{"weight":{weight}}}}}')
    kubectl("patch", "queue", "audited", "--type=merge", "-p", '{"spec":{"weight":9}}', "--dry-run=server")
    printed = kube_service.manage("shell", "-c", (
        "from draservice.models import AuditEvent\n"
        "for e in AuditEvent.objects.filter(kind='Queue', name='audited').order_by('id'):\n"
        "    print('event', e.actor.split(':')[0], e.actor_kind, e.operation,\n"
        "          [(c['path'], c['before'], c['after']) for c in e.changes] if e.operation == 'Update' else '')"))
    assert [line for line in printed.splitlines() if line.startswith("event ")] == [
        "event token admin Create ",
        "event token admin Update [('spec.weight', 1, 2)]",
        "event token admin Update [('spec.weight', 2, 3)]"]
