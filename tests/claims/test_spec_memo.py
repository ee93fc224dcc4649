"""claims.k8s.claim_spec_to_v1 keeps its outcome per spec as sent (a pipeline submits the same spec over and over):
the same answers as without it, errors rebased on each caller's path, and a spec of its own for every caller."""
from __future__ import annotations

import pytest

from claims import k8s
from draservice.errors import Invalid

GOOD = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}
BAD = {"devices": {"requests": [{"name": "Bad_Name", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}


def test_a_repeated_spec_gets_the_first_answer_in_an_object_of_its_own(monkeypatch):
    calls = []
    normalize = k8s.k8s_claims.normalize_claim
    monkeypatch.setattr(k8s.k8s_claims, "normalize_claim", lambda claim: calls.append(1) or normalize(claim))
    k8s._SPEC_MEMO.clear()
    first = k8s.claim_spec_to_v1(GOOD, k8s.V1, "spec")
    second = k8s.claim_spec_to_v1(dict(GOOD), k8s.V1, "spec")
    assert len(calls) == 1 and first == second and first is not second
    assert first["devices"]["requests"][0]["exactly"]["allocationMode"] == "ExactCount"  # defaulted, as before
    second["devices"]["requests"].clear()  # a caller changing its spec changes nobody else's
    assert k8s.claim_spec_to_v1(GOOD, k8s.V1, "spec") == first
    # Another apiVersion is another conversion.
    k8s.claim_spec_to_v1(GOOD, "resource.k8s.io/v1beta2", "spec")
    assert len(calls) == 2


def test_a_repeated_bad_spec_is_refused_at_each_callers_path():
    k8s._SPEC_MEMO.clear()
    with pytest.raises(Invalid) as one:
        k8s.claim_spec_to_v1(BAD, k8s.V1, "spec")
    with pytest.raises(Invalid) as two:
        k8s.claim_spec_to_v1(BAD, k8s.V1, "items[3].spec")
    assert [e["field"] for e in one.value.errors] == ["spec.devices.requests[0].name"]
    assert [e["field"] for e in two.value.errors] == ["items[3].spec.devices.requests[0].name"]
    assert one.value.errors[0]["reason"] == two.value.errors[0]["reason"]


def test_what_json_cannot_hold_is_converted_without_the_memo():
    k8s._SPEC_MEMO.clear()
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                "count": 2**70}}]}}
    with pytest.raises(Invalid):
        k8s.claim_spec_to_v1(spec, k8s.V1, "spec")
    assert k8s._SPEC_MEMO == {}
