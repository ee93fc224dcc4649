"""The real-world selectors of fixtures/real-cel.json against the real device shapes of
fixtures/real-slices.json.

Every selector that upstream 1.35 accepts compiles; those the fixture README flags as stale,
malformed or non-matching behave as upstream would (compile, then fail or never match).
"""
from fractions import Fraction

import pytest

from dra.cel import CELCompileError, CELRuntimeError, SelectorCache, compile_expression, validate_expression
from dra.cel.quantity import parse_quantity_value

# Index in real-cel.json -> why upstream 1.35 rejects it at compile time.
REJECTED_BY_135 = {37: "undeclared reference to 'includes'"}


def _by_index(real_selectors, i):
    return real_selectors[i]["expression"]


def test_every_selector_valid_upstream_compiles(real_selectors):
    assert len(real_selectors) == 59
    for i, entry in enumerate(real_selectors):
        if i in REJECTED_BY_135:
            with pytest.raises(CELCompileError) as info:
                compile_expression(entry["expression"])
            assert REJECTED_BY_135[i] in info.value.reason
            assert "1.36" in info.value.hint  # says why, not just "unknown"
        else:
            compile_expression(entry["expression"])


def _results(expression, fixture_devices):
    cache = SelectorCache()
    return {(node, name): r for (node, name, _), r in
            zip(fixture_devices, cache.evaluate_many(expression, [d for _, _, d in fixture_devices]), strict=False)}


def test_stale_index_selector_fails_with_no_such_key_where_upstream_would(real_selectors, fixture_devices):
    results = _results(_by_index(real_selectors, 8), fixture_devices)
    a100 = {k: v for k, v in results.items() if k[0] == "a100-dgx-node-01"}
    assert a100 and all(isinstance(v, CELRuntimeError) and v.reason == "no such key: index" for v in a100.values())
    # On other NVIDIA GPUs the first conjunct is false, so `&&` never reaches the missing
    # attribute; devices of other drivers have no productName in that domain at all.
    for (node, name, device) in fixture_devices:
        if node == "a100-dgx-node-01":
            continue
        got = results[(node, name)]
        if device.driver == "gpu.nvidia.com":
            assert got is False, (node, name)
        else:
            assert isinstance(got, CELRuntimeError) and got.reason == "no such key: productName", (node, name)
    err = next(iter(a100.values()))
    assert 'has no attribute "index"' in err.hint and "productName" in err.hint


@pytest.mark.parametrize("index,missing", [(32, "bool"), (44, "tpus"), (40, "memory")])
def test_malformed_selectors_fail_at_evaluation_as_upstream(real_selectors, fixture_devices, index, missing):
    # Upstream compiles these (attribute values are untyped, unknown domains are empty maps)
    # and fails each evaluation with "no such key".
    expression = _by_index(real_selectors, index)
    compile_expression(expression)
    results = _results(expression, fixture_devices)
    assert all(isinstance(v, CELRuntimeError) and v.reason == f"no such key: {missing}" for v in results.values())
    sample = results[("h100-hgx-node-01", "gpu-0")]
    # The hint names the domains the device does have.
    has = '"gpu.nvidia.com"' if "capacity" in expression else '"gpu.nvidia.com", "resource.kubernetes.io"'
    assert f"domains are: {has}" in sample.hint


def test_non_matching_intel_family_never_matches(real_selectors, fixture_devices):
    results = _results(_by_index(real_selectors, 29), fixture_devices)
    intel = {k: v for k, v in results.items() if k[0] == "rpl-s"}
    assert intel and all(v is False for v in intel.values())


def test_templated_selectors_compile_but_warn(real_selectors):
    for i in (15, 16):
        issues = validate_expression(_by_index(real_selectors, i))
        assert [x["severity"] for x in issues] == ["warning"]
        assert "template" in issues[0]["hint"]
    assert validate_expression(_by_index(real_selectors, 14)) == []  # "${arch}" is a valid string


def _oracle_type(device, value):
    attr = device.attributes.get("type")
    return device.driver == "gpu.nvidia.com" and attr is not None and attr.get("string") == value


@pytest.mark.parametrize("index,kind", [(0, "gpu"), (1, "mig")])
def test_device_class_selectors_match_what_the_slices_publish(real_selectors, fixture_devices, index, kind):
    results = _results(_by_index(real_selectors, index), fixture_devices)
    for node, name, device in fixture_devices:
        assert results[(node, name)] is _oracle_type(device, kind), (node, name)
    assert sum(v is True for v in results.values()) == {"gpu": 12, "mig": 200}[kind]


def test_quantity_selector_against_independent_arithmetic(real_selectors, fixture_devices):
    # multiprocessors.isGreaterThan(quantity("10")) && memory.isGreaterThan(quantity("10Gi"))
    results = _results(_by_index(real_selectors, 11), fixture_devices)
    for node, name, device in fixture_devices:
        caps = {k: parse_quantity_value(v["value"]) for k, v in device.capacity.items()}
        got = results[(node, name)]
        if device.driver != "gpu.nvidia.com" or "multiprocessors" not in caps:
            assert isinstance(got, CELRuntimeError), (node, name)
        else:
            expected = caps["multiprocessors"] > 10 and caps["memory"] > Fraction(10 * 2**30)
            assert got is expected, (node, name)


def test_semver_selector_on_driver_versions(fixture_devices):
    expr = 'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("570.0.0"))'
    results = _results(expr, fixture_devices)
    assert results[("h100-hgx-node-01", "gpu-0")] is True   # 570.133.20
    assert results[("gke-l4-pool-node-01", "gpu-0")] is False  # 535.104.5
