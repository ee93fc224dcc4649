"""The Kubernetes CEL libraries and CEL semantics as DRA selectors see them.

Each case is an expression that must evaluate to true, so a broken function fails the test
instead of silently returning false; error cases name the upstream error text.
"""
import pytest

from dra.cel import CELCompileError, CELDevice, CELRuntimeError, compile_expression

DEVICE = CELDevice(
    driver="dra.example.com",
    attributes={
        "s": {"string": "Hello, World"},
        "v": {"version": "1.2.3-rc.1"},
        "i": {"int": 7},
        "b": {"bool": True},
        "other.example.com/x": {"string": "qualified"},
    },
    capacity={"mem": {"value": "80Gi"}, "cores": "96"},
)

TRUE = [
    # kubernetes.quantity
    'quantity("200M").compareTo(quantity("0.2G")) == 0',
    'quantity("50M").compareTo(quantity("50Mi")) == -1',
    'quantity("50Mi").compareTo(quantity("50M")) == 1',
    'quantity("1Gi") == quantity("1024Mi")',
    'quantity("150Mi").isGreaterThan(quantity("100Mi")) && !quantity("50Mi").isGreaterThan(quantity("100Mi"))',
    'quantity("50M").isLessThan(quantity("100M"))',
    'quantity("1.5").isInteger() == false && quantity("2").isInteger()',
    'quantity("1500m").asApproximateFloat() == 1.5',
    'quantity("3k").asInteger() == 3000',
    'quantity("-1").sign() == -1 && sign(quantity("0")) == 0 && quantity("5n").sign() == 1',
    'quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi") && quantity("1").add(2) == quantity("3")',
    'quantity("1").sub(2).sign() == -1 && quantity("1Ki").sub(quantity("24")) == quantity("1000")',
    'isQuantity("1Gi") && isQuantity("1e3") && isQuantity(".5") && !isQuantity("1GB") && !isQuantity("")',
    'quantity("1.0000000001").isGreaterThan(quantity("1"))',  # rounded up to 1.000000001, as upstream
    'device.capacity["dra.example.com"].mem.isGreaterThan(quantity("79Gi"))',
    'device.capacity["dra.example.com"].mem.compareTo(quantity("80Gi")) >= 0',
    'device.capacity["dra.example.com"].cores == quantity("96")',
    # kubernetes.Semver
    'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3',
    'semver("1.0.0").isGreaterThan(semver("1.0.0-rc.1"))',
    'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))',
    'semver("1.0.0-alpha.beta").compareTo(semver("1.0.0-beta")) == -1',
    'semver("1.0.0-2").isLessThan(semver("1.0.0-10")) && semver("1.0.0-10").isLessThan(semver("1.0.0-a"))',
    'semver("1.0.0+build.1") == semver("1.0.0")',
    'semver("v1.2", true) == semver("1.2.0") && semver("01.01.01", true) == semver("1.1.1")',
    'isSemver("1.0.0") && !isSemver("v1.0.0") && isSemver("v1.0.0", true) && !isSemver("1.0")',
    'device.attributes["dra.example.com"].v.isLessThan(semver("1.2.3"))',
    'device.attributes["dra.example.com"].v.compareTo(semver("1.2.3-rc.0")) == 1',
    # cel-go strings extension v2
    '"abc".charAt(1) == "b" && "abc".charAt(3) == ""',
    '"hello mellow".indexOf("ello") == 1 && "hello mellow".indexOf("ello", 2) == 7 && "hello".indexOf("") == 0',
    '"hello mellow".lastIndexOf("ello") == 7 && "hello mellow".lastIndexOf("ello", 6) == 1',
    '"TacoCat".lowerAscii() == "tacocat" && "TacoCat".upperAscii() == "TACOCAT" && "Ä".lowerAscii() == "Ä"',
    '"hello hello".replace("he", "we") == "wello wello" && "hello hello".replace("he", "we", 1) == "wello hello"',
    '"a,b,c".split(",") == ["a", "b", "c"] && "a,b,c".split(",", 2) == ["a", "b,c"] && "a,b".split(",", 0) == []',
    '"tacocat".substring(4) == "cat" && "tacocat".substring(0, 4) == "taco"',
    '"  \\ttrim\\n ".trim() == "trim"',
    '["a", "b"].join() == "ab" && ["a", "b"].join("-") == "a-b"',
    'strings.quote("a\\"b") == "\\"a\\\\\\"b\\""',
    # Kubernetes regex library and RE2 matches
    '"abc123def456".find("[0-9]+") == "123" && "abc".find("[0-9]+") == ""',
    '"abc123def456".findAll("[0-9]+") == ["123", "456"] && "a1b2c3".findAll("[0-9]", 2) == ["1", "2"]',
    '"a1b22".findAll("[0-9]*") == ["", "1", "22"]',  # Go drops empty matches right after a match
    '"abc".matches("^a.c$") && !"abc".matches("^b") && matches("abc", "b")',
    'device.attributes["dra.example.com"].s.lowerAscii().matches("^.*world$")',
    # Kubernetes lists library
    '[1, 2, 3].isSorted() && ![3, 1].isSorted() && ["a", "b"].isSorted() && [].isSorted()',
    '[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0 && [].sum() == 0',
    '[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3 && ["b", "a"].min() == "a"',
    '[1, 2, 3, 2].indexOf(2) == 1 && [1, 2, 3, 2].lastIndexOf(2) == 3 && [1].indexOf(5) == -1',
    # cel-go sets extension
    'sets.contains([1, 2, 3], [2, 3]) && !sets.contains([1], [2]) && sets.contains([1], [])',
    'sets.equivalent([1, 2], [2, 1, 1]) && sets.intersects([1, 2], [2, 5]) && !sets.intersects([1], [])',
    # cel.bind and comprehensions
    'cel.bind(x, 2, x * x == 4)',
    'cel.bind(a, device.attributes["dra.example.com"], a.i == 7 && a.b)',
    '[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2) && [1, 2, 3].exists_one(x, x == 2)',
    '[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x > 1) == [2, 3]',
    '[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]',
    '[1, 2, 3].all(i, v, v > i) && {"a": 1}.exists(k, v, k == "a" && v == 1) && [5].existsOne(i, v, v == 5)',
    '[1, 2].transformList(i, v, v * 10) == [10, 20] && {"a": 1}.transformMap(k, v, v + 1) == {"a": 2}',
    '[0, 1].exists(x, 1 / x > 0)',  # an error in one element is absorbed by a true one, as in CEL
    '{"a": 1, "b": 2}.all(k, k in ["a", "b"]) && device.attributes.exists(d, d == "other.example.com")',
    # device variable
    'device.driver == "dra.example.com" && device.attributes["other.example.com"].x == "qualified"',
    'has(device.attributes["dra.example.com"].s) && !has(device.attributes["dra.example.com"].zzz)',
    '!has(device.attributes["no.such.domain"].zzz) && device.attributes["no.such.domain"].size() == 0',
    'device.attributes["dra.example.com"]["i"] in [1, 7] && "dra.example.com" in device.capacity',
    'device.allowMultipleAllocations == false',
    # equality and numbers
    'device.attributes["dra.example.com"].i == 7.0 && device.attributes["dra.example.com"].i != "7"',
    '1 < 1.5 && 2u > 1 && "a" < "b" && false < true',
    '"a" + "b" == "ab" && [1] + [2] == [1, 2] && 7 / 2 == 3 && -7 / 2 == -3 && -7 % 3 == -1',
    '1.0 / 0.0 > 1e308 && int("12") == 12 && string(12) == "12" && double("1.5") == 1.5',
    'dyn(1) == 1 && type(1) == int',
    'true ? device.attributes["dra.example.com"].b : false',
]


@pytest.mark.parametrize("expression", TRUE)
def test_expression_is_true(expression):
    assert compile_expression(expression).evaluate(DEVICE) is True


RUNTIME_ERRORS = [
    ('quantity("abc") == quantity("1")', "quantities must match the regular expression"),
    ('quantity("1.5").asInteger() == 1', "cannot convert value to integer"),
    ('semver("1.0") == semver("1.0.0")', "No Major.Minor.Patch elements found"),
    ('semver("01.0.0") == semver("1.0.0")', 'Major number must not contain leading zeroes "01"'),
    ('semver("1.0", true) == semver("1.0-rc", true)', "short version cannot contain PreRelease/Build meta data"),
    ('"abc".charAt(4) == ""', "index out of range: 4"),
    ('"tacocat".substring(5, 4) == ""', "invalid substring range. start: 5, end: 4"),
    ('[].min() == 1', "min called on empty list"),
    ('[0, 1].all(x, 1 / x > 0)', "division by zero"),
    ('[1, 2][2] == 1', "index out of range: 2"),
    ('[1, 2][-1] == 1', "index out of range: -1"),
    ('{"a": 1}["b"] == 1', "no such key: b"),
    ('9223372036854775807 + 1 == 0', "integer overflow"),
    ('"x".matches(device.attributes["dra.example.com"].s + "[")', "error parsing regexp"),
    ('device.attributes["dra.example.com"].v > semver("1.0.0")', "found no matching overload for '_>_'"),
]


@pytest.mark.parametrize("expression,message", RUNTIME_ERRORS)
def test_runtime_error(expression, message):
    compiled = compile_expression(expression)
    with pytest.raises(CELRuntimeError) as info:
        compiled.evaluate(DEVICE)
    assert message in info.value.reason


COMPILE_ERRORS = [
    ('quantity("1") == 1', "found no matching overload for '_==_' applied to '(Quantity, int)'"),
    ('device.capacity["dra.example.com"].mem < quantity("79Gi")', "found no matching overload for '_<_'"),
    ('semver("1.0.0")', "must evaluate to bool or the unknown type, not Semver"),
    ('"abc".matches("[")', "invalid matches argument: error parsing regexp"),
    ("1 == 1.0", "found no matching overload for '_==_' applied to '(int, double)'"),
    ('[1, "a"] == []', "expected type 'int' but found 'string'"),
    ('"a" + 1 == "a1"', "found no matching overload for '_+_' applied to '(string, int)'"),
    ('device.attributes["dra.example.com"].s.reverse() == "x"', "undeclared reference to 'reverse'"),
    ('device.pool == "x"', "undefined field 'pool'"),
    ("unknownVar == 1", "undeclared reference to 'unknownVar'"),
    ("true ? 1 : 2", "must evaluate to bool or the unknown type, not int"),
    ("dyn(1)", "must evaluate to bool or the unknown type, not dyn"),
    ("has(device)", "invalid argument to has() macro"),
    ('device.driver.size("x") == 1', "found no matching overload for 'size'"),
    ('cel.bind(1, 2, true)', "cel.bind() variable name must be a simple identifier"),
    ('[1].all(x)', "all() needs a variable name and an expression"),
    ('device.capacity["a"].b.add("1") == quantity("1")', "found no matching overload for 'add'"),
    ('device.attributes["dra.example.com"].s.startsWith(1)', "found no matching overload for 'startsWith'"),
]


@pytest.mark.parametrize("expression,message", COMPILE_ERRORS)
def test_compile_error(expression, message):
    with pytest.raises(CELCompileError) as info:
        compile_expression(expression)
    assert message in info.value.reason


def test_attribute_value_kinds_map_to_cel_types():
    for expr in (
        'device.attributes["dra.example.com"].i + 1 == 8',
        'device.attributes["dra.example.com"].b == true',
        'device.attributes["dra.example.com"].s.size() == 12',
        'device.attributes["dra.example.com"].v.major() == 1',
    ):
        assert compile_expression(expr).evaluate(DEVICE) is True, expr


def test_unparseable_version_attribute_fails_every_expression_like_upstream():
    bad = CELDevice("d.example.com", {"v": {"version": "1.0"}})
    with pytest.raises(CELRuntimeError) as info:
        compile_expression("true").evaluate(bad)
    assert "attribute v: parse semantic version: No Major.Minor.Patch elements found" in info.value.reason


def test_attribute_with_no_or_two_values_is_reported():
    bad = CELDevice("d.example.com", {"x": {"int": 1, "string": "a"}})
    with pytest.raises(CELRuntimeError, match="unsupported attribute value"):
        compile_expression("true").evaluate(bad)


def test_allow_multiple_allocations_is_gated_by_the_feature():
    expr = "device.allowMultipleAllocations"
    on = CELDevice("d.example.com", allow_multiple_allocations=True)
    assert compile_expression(expr).evaluate(on) is True
    with pytest.raises(CELCompileError, match="undefined field 'allowMultipleAllocations'") as info:
        compile_expression(expr, consumable_capacity=False)
    assert "DRAConsumableCapacity" in info.value.hint
