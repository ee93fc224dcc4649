"""Fixtures shared by the CEL tests: the real ResourceSlice shapes and selectors."""
import json
import os

import pytest

from dra.cel import CELDevice


def _load(shared_dir, name):
    with open(os.path.join(shared_dir, "fixtures", name)) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def real_selectors(shared_dir):
    return _load(shared_dir, "real-cel.json")


@pytest.fixture(scope="session")
def fixture_devices(shared_dir):
    """Every device of real-slices.json as (node, device name, CELDevice)."""
    out = []
    for s in _load(shared_dir, "real-slices.json"):
        spec = s["spec"]
        for d in spec.get("devices") or []:
            out.append((
                spec.get("nodeName"),
                d["name"],
                CELDevice(
                    driver=spec["driver"],
                    attributes=d.get("attributes") or {},
                    capacity=d.get("capacity") or {},
                    allow_multiple_allocations=d.get("allowMultipleAllocations"),
                ),
            ))
    assert len(out) == 248
    return out
