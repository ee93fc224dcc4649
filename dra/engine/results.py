"""Turning the picks of a successful search into v1 ``AllocationResult`` JSON, as upstream writes it.

* ``devices.results`` in allocation order, with ``adminAccess``, ``tolerations``, ``bindingConditions``,
  ``bindingFailureConditions``, ``shareID`` and ``consumedCapacity`` only where they apply;
* ``devices.config``: the class configs of each class used (once per class, listing every request that used
  it), then the claim configs that apply to an allocated request or subrequest, each once (upstream 1.35
  copied a config once per request it named: fixed upstream in ``c5a40b2``; not copied here). Request lists
  are kept as given (upstream later started to drop a list that names every request; both mean the same);
* ``nodeSelector``: ``metadata.name In [node]`` when any device is node-local or binds to the node, else the
  requirements of the network-attached devices' selectors merged into one term, else none.
"""
from __future__ import annotations

import uuid
from typing import Any

from .model import Node
from .plan import ClaimPlan
from .quantity import format_quantity
from .search import Pick

# Share IDs must be unique per device and stable for equal input (determinism); a UUIDv5 over the device, the
# claim and a per-engine sequence number gives both.
_SHARE_NAMESPACE = uuid.UUID("6f0b4a52-6c1d-4d55-9a8e-2f1b9b3d0c11")


def share_id(seed: str) -> str:
    return str(uuid.uuid5(_SHARE_NAMESPACE, seed))


def build_allocation(cp: ClaimPlan, picks: list[Pick], selected: dict[int, int], node: Node | None,
                     features, share_ids: list[str | None]) -> dict:
    results = []
    for pick, sid in zip(picks, share_ids, strict=False):
        d, alt = pick.device, pick.alt
        r: dict[str, Any] = {"request": alt.name, "driver": d.driver, "pool": d.pool, "device": d.name}
        if alt.admin:
            r["adminAccess"] = True
        if alt.tolerations:
            r["tolerations"] = [dict(t) for t in alt.tolerations]
        if features.device_binding_and_status:
            if d.binding_conditions:
                r["bindingConditions"] = list(d.binding_conditions)
            if d.binding_failure_conditions:
                r["bindingFailureConditions"] = list(d.binding_failure_conditions)
        if sid is not None:
            r["shareID"] = sid
        if pick.amounts:
            r["consumedCapacity"] = {name: str(q) for name, q in pick.amounts.items()}
        results.append(r)
    devices: dict = {"results": results}
    config = _configs(cp, selected)
    if config:
        devices["config"] = config
    out: dict = {"devices": devices}
    selector = node_selector(picks, node)
    if selector is not None:
        out["nodeSelector"] = selector
    return out


def _selected_names(cp: ClaimPlan, selected: dict[int, int]) -> list[tuple[str, str | None]]:
    """(request name, selected "request/subrequest" name or None) per request of the claim."""
    out: list[tuple[str, str | None]] = []
    for ri, rp in enumerate(cp.requests):
        if rp.has_sub:
            alt = rp.alts[selected.get(ri, 0)]
            out.append((rp.name, alt.name))
        else:
            out.append((rp.name, None))
    return out


def _configs(cp: ClaimPlan, selected: dict[int, int]) -> list[dict]:
    config: list[dict] = []
    class_ranges: dict[str, tuple[int, int]] = {}
    for ri, rp in enumerate(cp.requests):
        alt = rp.alts[selected.get(ri, 0)] if rp.has_sub else rp.alts[0]
        klass = alt.klass
        name = klass.get("metadata", {}).get("name", alt.class_name)
        if name in class_ranges:
            start, end = class_ranges[name]
            for i in range(start, end):
                config[i]["requests"].append(alt.name)
            continue
        start = len(config)
        for c in (klass.get("spec") or {}).get("config") or []:
            entry = {"source": "FromClass", "requests": [alt.name]}
            entry.update({k: v for k, v in c.items() if k != "requests"})
            config.append(entry)
        class_ranges[name] = (start, len(config))
    claim_configs = (((cp.claim.get("spec") or {}).get("devices")) or {}).get("config") or []
    names = _selected_names(cp, selected) if claim_configs else []
    for c in claim_configs:
        wanted = c.get("requests") or []
        applies = not wanted or any(base in wanted or (sub is not None and sub in wanted) for base, sub in names)
        if not applies:
            continue
        entry = {"source": "FromClaim"}
        if wanted:
            entry["requests"] = list(wanted)
        entry.update({k: v for k, v in c.items() if k != "requests"})
        config.append(entry)
    return config


def node_selector(picks: list[Pick], node: Node | None) -> dict | None:
    """``createNodeSelector``."""
    fields: list[dict] = []
    exprs: list[dict] = []
    for pick in picks:
        d = pick.device
        if d.result_node_name is not None or d.binds_to_node:
            return {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node.name if node else d.result_node_name]}]}]}
        sel = d.result_node_selector
        if sel is not None:
            terms = sel.get("nodeSelectorTerms") or []
            if len(terms) == 1:
                _add_requirements(terms[0].get("matchFields") or [], fields)
                _add_requirements(terms[0].get("matchExpressions") or [], exprs)
    if not fields and not exprs:
        return None
    term: dict = {}
    if exprs:
        term["matchExpressions"] = exprs
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}


def _add_requirements(src: list[dict], dst: list[dict]) -> None:
    for req in src:
        values = set(req.get("values") or [])
        if any(r.get("key") == req.get("key") and r.get("operator") == req.get("operator")
               and set(r.get("values") or []) == values for r in dst):
            continue
        dst.append(dict(req))


def consumed_to_strings(amounts) -> dict[str, str]:
    return {name: format_quantity(q.value, q.fmt) for name, q in amounts.items()}
