"""Error messages: plain English, with the expression, the position and a hint where one helps."""
import pickle

import pytest

from dra.cel import (
    CELCompileError,
    CELDevice,
    CELError,
    CELRuntimeError,
    SelectorCache,
    compile_expression,
    validate_expression,
)

H100 = CELDevice(
    "gpu.nvidia.com",
    {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
     "driverVersion": {"version": "570.133.20"}},
    {"memory": {"value": "81559Mi"}},
)


def compile_error(expression, **kw) -> CELCompileError:
    with pytest.raises(CELCompileError) as info:
        compile_expression(expression, **kw)
    return info.value


def runtime_error(expression, device=H100) -> CELRuntimeError:
    with pytest.raises(CELRuntimeError) as info:
        compile_expression(expression).evaluate(device)
    return info.value


def test_comparison_operator_on_quantity_suggests_compare_to():
    expr = 'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")'
    err = compile_error(expr)
    assert err.reason == "found no matching overload for '_>=_' applied to '(Quantity, Quantity)'"
    assert err.position == expr.index(">=")
    assert '.compareTo(quantity("40Gi")) >= 0' in err.hint
    assert 'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))' in err.hint
    text = str(err)
    assert expr in text and "line 1, column 42" in text and "hint:" in text


@pytest.mark.parametrize("op,suffix,method", [("<", "< 0", "isLessThan"), (">", "> 0", "isGreaterThan")])
def test_each_ordering_operator_gets_the_matching_rewrite(op, suffix, method):
    err = compile_error(f'quantity("1") {op} quantity("2")')
    assert f'quantity("1").compareTo(quantity("2")) {suffix}' in err.hint and method in err.hint


def test_comparison_on_semver_attribute_at_runtime_gets_the_hint():
    # Attribute values are untyped at compile time (as upstream), so this fails per device.
    expr = 'device.attributes["gpu.nvidia.com"].driverVersion > semver("550.0.0")'
    err = runtime_error(expr)
    assert "found no matching overload for '_>_' applied to '(Semver, Semver)'" in err.reason
    assert err.position == expr.index(">")
    assert "compareTo" in err.hint and "isGreaterThan" in err.hint


def test_unknown_domain_lists_the_domains_the_device_has():
    expr = 'device.attributes["memory"].size == 1'
    err = runtime_error(expr)
    assert err.reason == "no such key: size"
    assert err.position == expr.index("size")
    assert 'no attributes domain "memory"' in err.hint
    assert '"gpu.nvidia.com", "resource.kubernetes.io"' in err.hint


def test_missing_attribute_names_what_the_domain_has_and_how_to_guard():
    err = runtime_error('device.attributes["gpu.nvidia.com"].index == 0')
    assert err.reason == "no such key: index"
    assert "driverVersion, productName" in err.hint
    assert 'has(device.attributes["gpu.nvidia.com"].index)' in err.hint


def test_index_lookup_error_points_at_the_key():
    expr = 'device.attributes["gpu.nvidia.com"]["index"] == 0'
    assert runtime_error(expr).position == expr.index('"index"')


def test_function_error_points_at_the_function():
    expr = 'device.driver != "" && quantity("x").isInteger()'
    err = runtime_error(expr)
    assert err.reason.startswith("quantities must match the regular expression")
    assert err.position == expr.index("quantity")


def test_non_bool_result_is_a_compile_error_when_known_and_a_runtime_error_otherwise():
    assert compile_error('device.driver').reason == "must evaluate to bool or the unknown type, not string"
    # Attribute values are "unknown type" at compile time: accepted, then checked per device.
    err = runtime_error('device.attributes["gpu.nvidia.com"].productName')
    assert err.reason == "CEL result of type string could not be converted to bool"


@pytest.mark.parametrize(
    "expression,reason,hint",
    [
        ("device.driver = 'x'", "Syntax error: unexpected '='", "=="),
        ("device.attributes['x'].?y", "Syntax error: unexpected '?'", "has("),
        ("(device.driver == 'x'", "Syntax error: unexpected end of expression", "missing"),
        ("device.drivr == 'x'", "undefined field 'drivr'", "did you mean 'driver'?"),
        ("device.driver.lowerASCII() == 'x'", "undeclared reference to 'lowerASCII'", "did you mean 'lowerAscii'?"),
        ("device.attributes['a.io'].x.includes(1)", "undeclared reference to 'includes'", "1.36"),
        ("device.allowMultipleAllocations", "undefined field 'allowMultipleAllocations'", "DRAConsumableCapacity"),
    ],
)
def test_compile_error_messages(expression, reason, hint):
    err = compile_error(expression, consumable_capacity=False)
    assert err.reason.startswith(reason)
    assert err.position is not None
    assert hint in err.hint


def test_errors_survive_pickling_for_celery():
    err = runtime_error('device.attributes["memory"].size == 1')
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is CELRuntimeError and clone == err and str(clone) == str(err)
    assert isinstance(clone, CELError)


def test_validate_expression_reports_errors_and_warnings():
    assert validate_expression('device.driver == "gpu.nvidia.com"') == []
    [issue] = validate_expression('device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")')
    assert issue["severity"] == "error" and issue["position"] == 41 and "compareTo" in issue["hint"]
    issues = validate_expression('device.attributes["gpu.nvidia.com/productName"] == "x" || 1 == "a"')
    assert [i["severity"] for i in issues] == ["error", "error", "warning"]
    assert 'device.attributes["gpu.nvidia.com"].productName' in issues[2]["hint"]
    [warning] = validate_expression('device.capacity["memory"].value.isInteger()')
    assert warning["severity"] == "warning" and "does not look like a domain" in warning["message"]
    # `device.attributes.productName` is the domain map "productName": a type error, explained.
    error, warning = validate_expression('device.attributes.productName == "x"')
    assert "(map(string, any), string)" in error["message"]
    assert 'device.attributes["<domain>"].productName' in warning["hint"]


def test_validate_expression_flags_literals_that_will_always_fail():
    [warning] = validate_expression('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40 Gi"))')
    assert warning["severity"] == "warning" and "will fail for every device" in warning["message"]


def test_selector_cache_raises_the_same_error_object_content():
    cache = SelectorCache()
    first = second = None
    try:
        cache.evaluate('device.attributes["gpu.nvidia.com"].index == 0', H100)
    except CELRuntimeError as exc:
        first = exc
    try:
        cache.evaluate('device.attributes["gpu.nvidia.com"].index == 0', H100)
    except CELRuntimeError as exc:
        second = exc
    assert first is not None and first == second
