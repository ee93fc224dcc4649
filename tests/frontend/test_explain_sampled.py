"""A failure explanation cut by the engine's budget (dra.engine.explain_walk), as the claim page tells it: the
funnel shows the devices left out and the verdict says the counts are partial."""
from __future__ import annotations

from benchmarks.engine_bench import claim, exact, gpu_fleet
from dra.engine import ClaimGroup, Engine
from frontend.explain import explain_request


def test_a_sampled_explanation_shows_the_devices_it_left_out():
    engine = Engine(gpu_fleet(4, 8))
    engine.explain_checks = 4
    out = engine.allocate(ClaimGroup(key="big", claims=[claim("big", [exact("gpu", "gpu", 9)])]))
    entry = out.diagnostics["requests"][0]
    assert not out.allocated and entry["sampled"] and entry["not_examined"] == 28 and entry["available"] == 4
    r = explain_request(entry)
    step = r.funnel[-1]
    assert step.label.startswith("28 not examined") and step.remaining == r.available == 4
    assert "28 devices were not examined" in r.verdict
