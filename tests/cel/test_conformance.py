"""Upstream's CEL table tests (cel/compile_test.go, Kubernetes 1.35) run against dra.cel.

The vectors are read from the shared conformance directory (``@pytest.mark.vectors``, tests/conftest.py); the
file is the source of truth, so every case is a separate test and a new case shows up here without code changes.
"""
import pytest

from dra.cel import CELBudgetExceeded, CELCompileError, CELDevice, CELRuntimeError, compile_expression

# Cases whose semantics need libraries newer than Kubernetes 1.35, with the reason.
# (None of the 37 1.35 vectors needs one today; keep the mechanism so later tables can say why.)
NEWER_THAN_135: dict[str, str] = {}


def test_vector_file_is_the_135_table(cel_cases):
    assert len(cel_cases) == 37
    assert sum(1 for c in cel_cases if c["expectCompileError"]) == 3
    assert sum(1 for c in cel_cases if c["expectMatchError"]) == 3


@pytest.mark.vectors("conformance/k8s-cel-cases.json", xfail=NEWER_THAN_135)
def test_upstream_cel_case(case):
    # StoredExpressions (the default) has every feature of the version; NewExpressions follows
    # the feature flag, which is what decides whether allowMultipleAllocations exists.
    consumable = case["enableConsumableCapacity"] if case["envType"] == "NewExpressions" else True
    device = CELDevice(
        driver=case["driver"],
        attributes=case["attributes"],
        capacity=case["capacity"],
        allow_multiple_allocations=case["allowMultipleAllocations"],
    )
    if case["expectCompileError"]:
        with pytest.raises(CELCompileError) as info:
            compile_expression(case["expression"], consumable_capacity=consumable)
        assert case["expectCompileError"] in str(info.value)
        return
    compiled = compile_expression(case["expression"], consumable_capacity=consumable)
    if case["expectMatchError"]:
        with pytest.raises(CELRuntimeError) as info:
            compiled.evaluate(device)
        assert case["expectMatchError"] in str(info.value)
        if "cost limit" in case["expectMatchError"]:
            assert isinstance(info.value, CELBudgetExceeded)
        return
    assert compiled.evaluate(device) is case["expectMatch"]
