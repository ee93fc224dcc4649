"""Objects answered in the version asked for: the service stores v1; v1beta2 has v1's shape; v1beta1 keeps a
request's fields directly on the request (no ``exactly``) and a slice's device fields under ``basic``."""
from __future__ import annotations

import copy

FLAT_REQUESTS = ("v1beta1", "v1alpha3")  # versions whose requests hold exactly's fields directly


def claim_spec_out(spec: dict | None, version: str) -> dict | None:
    if version not in FLAT_REQUESTS or not isinstance(spec, dict):
        return spec
    spec = copy.deepcopy(spec)
    devices = spec.get("devices") or {}
    requests = []
    for req in devices.get("requests") or []:
        if isinstance(req, dict) and isinstance(req.get("exactly"), dict):
            flat = {"name": req.get("name"), **req["exactly"]}
            requests.append(flat)
        else:
            requests.append(req)
    if devices:
        devices["requests"] = requests
    return spec


def template_spec_out(spec: dict | None, version: str) -> dict | None:
    if version not in FLAT_REQUESTS or not isinstance(spec, dict):
        return spec
    return {**spec, "spec": claim_spec_out(spec.get("spec"), version)}


def slice_out(obj: dict, version: str) -> dict:
    if version not in FLAT_REQUESTS:
        return obj
    obj = copy.deepcopy(obj)
    spec = obj.get("spec") or {}
    spec["devices"] = [{"name": d.get("name"), "basic": {k: v for k, v in d.items() if k != "name"}}
                       for d in spec.get("devices") or []]
    return obj
