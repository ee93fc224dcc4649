"""SelectorCache: an unchanged device is evaluated once per expression, a changed one again;
devices that differ only in what an expression does not read share its evaluation."""
import threading

import pytest

from dra.cel import CELCompileError, CELDevice, CELRuntimeError, SelectorCache, compile_expression

PRODUCT = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'


def gpu(uuid="GPU-1", product="NVIDIA H100 80GB HBM3", memory="81559Mi", **extra):
    attrs = {"uuid": {"string": uuid}, "productName": {"string": product}, "type": {"string": "gpu"}}
    attrs.update(extra)
    return CELDevice("gpu.nvidia.com", attrs, {"memory": {"value": memory}})


def test_unchanged_device_is_evaluated_once():
    cache = SelectorCache()
    device = gpu()
    assert cache.evaluate(PRODUCT, device) is True
    assert cache.evaluate(PRODUCT, device) is True
    assert cache.evaluate(PRODUCT, gpu()) is True  # same content, new object (re-read from the DB)
    stats = cache.stats()
    assert stats["evaluations"] == 1
    assert stats["hits"] == 2


def test_changed_device_is_evaluated_again():
    cache = SelectorCache()
    assert cache.evaluate(PRODUCT, gpu()) is True
    assert cache.evaluate(PRODUCT, gpu(product="NVIDIA L4")) is False
    assert cache.stats()["evaluations"] == 2


def test_change_the_expression_does_not_read_shares_the_result():
    cache = SelectorCache()
    fleet = [gpu(uuid=f"GPU-{i}") for i in range(50)]
    assert cache.evaluate_many(PRODUCT, fleet) == [True] * 50
    assert cache.stats()["evaluations"] == 1
    # An expression that does read the uuid is evaluated per distinct uuid.
    by_uuid = 'device.attributes["gpu.nvidia.com"].uuid == "GPU-3"'
    assert cache.evaluate_many(by_uuid, fleet) == [i == 3 for i in range(50)]
    assert cache.stats()["evaluations"] == 51


def test_whole_device_expressions_fall_back_to_the_full_content_key():
    # `device` bound to a variable: the footprint is unknown, so any change re-evaluates.
    expr = 'cel.bind(d, device, d.driver == "gpu.nvidia.com")'
    assert compile_expression(expr).footprint is None
    cache = SelectorCache()
    assert cache.evaluate_many(expr, [gpu("a"), gpu("a"), gpu("b")]) == [True, True, True]
    assert cache.stats()["evaluations"] == 2


def test_errors_are_cached_and_raised_again():
    cache = SelectorCache()
    expr = 'device.attributes["gpu.nvidia.com"].index == 0'
    with pytest.raises(CELRuntimeError) as first:
        cache.evaluate(expr, gpu("a"))
    with pytest.raises(CELRuntimeError) as second:
        cache.evaluate(expr, gpu("b"))
    assert first.value == second.value
    assert "no such key: index" in str(second.value)
    assert cache.stats()["evaluations"] == 1
    # Adding the attribute is a relevant change.
    assert cache.evaluate(expr, gpu("c", index={"int": 0})) is True
    assert cache.stats()["evaluations"] == 2


def test_compile_errors_are_raised_not_cached_as_results():
    cache = SelectorCache()
    with pytest.raises(CELCompileError):
        cache.evaluate("device.nope", gpu())
    assert cache.stats()["evaluations"] == 0


def test_memo_is_bounded_and_keeps_hot_entries():
    cache = SelectorCache(max_entries=10)
    hot = gpu("hot")
    exprs = [f'device.attributes["gpu.nvidia.com"].uuid == "u{i}"' for i in range(40)]
    for e in exprs:
        cache.evaluate(e, gpu(e))
        cache.evaluate(PRODUCT, hot)  # touched constantly: survives generation switches
    stats = cache.stats()
    assert stats["entries"] <= 10
    assert stats["generations"] >= 4
    assert stats["evaluations"] == len(exprs) + 1


def test_evaluate_many_matches_single_evaluation_and_uses_the_driver_index():
    cache = SelectorCache()
    other = CELDevice("gpu.amd.com", {"type": {"string": "amdgpu"}})
    expr = 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"'
    assert cache.evaluate_many(expr, [gpu(), other]) == [True, False]
    assert cache.stats()["driver_index_skips"] == 1
    # Without the index the AMD device is evaluated (and is false, not an error: && short-circuits).
    assert cache.evaluate_many(expr, [gpu(), other], use_driver_index=False) == [True, False]


def test_driver_index_never_hides_an_unusable_device():
    broken = CELDevice("gpu.amd.com", {"v": {"version": "not-semver"}})
    [result] = SelectorCache().evaluate_many('device.driver == "gpu.nvidia.com"', [broken])
    assert isinstance(result, CELRuntimeError)
    assert "parse semantic version" in result.reason


@pytest.mark.parametrize(
    "expression,drivers",
    [
        ('device.driver == "a.io"', {"a.io"}),
        ('"a.io" == device.driver && device.attributes["a.io"].x', {"a.io"}),
        ('device.attributes["a.io"].x && device.driver == "a.io"', {"a.io"}),
        ('device.driver in ["a.io", "b.io"] && true', {"a.io", "b.io"}),
        ('(device.driver == "a.io" || device.driver == "b.io") && device.attributes["a.io"].x', {"a.io", "b.io"}),
        ('device.driver == "a.io" && device.driver == "b.io"', set()),
        ('device.driver == "a.io" || device.attributes["a.io"].x', None),
        ('device.driver != "a.io"', None),
        ('device.driver.startsWith("a")', None),
        ("true", None),
        ('device.driver == "a.io" ? true : false', None),
    ],
)
def test_driver_index(expression, drivers):
    compiled = compile_expression(expression)
    assert (None if compiled.drivers is None else set(compiled.drivers)) == drivers


def test_cache_results_equal_direct_evaluation_on_the_real_fleet(fixture_devices, real_selectors):
    """Projection-keyed memo must never change a result: compare with direct evaluation for
    every real selector on every fixture device (and copies differing in uuid/PCI address)."""
    devices = [d for _, _, d in fixture_devices]
    for i, (_, _, d) in enumerate(fixture_devices[:60]):
        attrs = dict(d.attributes)
        for name in ("uuid", "resource.kubernetes.io/pciBusID"):
            if name in attrs:
                attrs[name] = {"string": f"{attrs[name]['string']}-copy{i}"}
        devices.append(CELDevice(d.driver, attrs, d.capacity, d.allow_multiple_allocations))
    cache = SelectorCache()
    checked = 0
    for entry in real_selectors:
        try:
            compiled = compile_expression(entry["expression"])
        except CELCompileError:
            continue
        memo = cache.evaluate_many(entry["expression"], devices)
        for device, got in zip(devices, memo, strict=False):
            try:
                expected = compiled.evaluate(device)
            except CELRuntimeError as exc:
                expected = exc
            assert got == expected, (entry["expression"], device)
            checked += 1
    assert checked == 58 * len(devices)
    assert cache.stats()["evaluations"] < checked / 5


def test_concurrent_use_gives_the_same_results(fixture_devices, real_selectors):
    devices = [d for _, _, d in fixture_devices]
    exprs = [e["expression"] for e in real_selectors if "includes(" not in e["expression"]]
    expected = {e: SelectorCache().evaluate_many(e, devices) for e in exprs}
    shared = SelectorCache(max_entries=500)  # small, so generation switches happen under load
    failures = []

    def worker(offset):
        for e in exprs[offset:] + exprs[:offset]:
            if shared.evaluate_many(e, devices) != expected[e]:
                failures.append(e)

    threads = [threading.Thread(target=worker, args=(i * 7,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_device_key_is_content_based():
    a = CELDevice("d.io", {"x": {"int": 1}, "y": {"string": "s"}},
                  {"m": {"value": "1Gi", "requestPolicy": {"default": "1"}}})
    b = CELDevice("d.io", {"y": {"string": "s"}, "x": {"int": 1}}, {"m": {"value": "1Gi"}})
    assert a.key() == b.key() and a == b and hash(a) == hash(b)
    assert CELDevice("d.io", {"x": {"int": 1}}).key() != CELDevice("d.io", {"x": {"bool": True}}).key()
    assert CELDevice("d.io", allow_multiple_allocations=True).key() != CELDevice("d.io").key()


def test_consumable_capacity_flag_is_per_cache():
    expr = "device.allowMultipleAllocations == false"
    assert SelectorCache().evaluate(expr, gpu()) is True
    with pytest.raises(CELCompileError):
        SelectorCache(consumable_capacity=False).evaluate(expr, gpu())


def test_devices_pickle_without_their_caches():
    import pickle

    device = gpu()
    SelectorCache().evaluate(PRODUCT, device)
    assert device._view is not None
    clone = pickle.loads(pickle.dumps(device))
    assert clone._view is None and clone._key is None
    assert clone == device
    assert SelectorCache().evaluate(PRODUCT, clone) is True
