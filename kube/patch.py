"""PATCH bodies: JSON merge patch (RFC 7386, what kubectl sends for resource.k8s.io/v1, which kubectl 1.32 has
not compiled in), strategic merge patch (what it sends for the kinds it knows: resource.k8s.io/v1beta1, Pods,
apps/v1, batch/v1) and JSON patch (RFC 6902).

Strategic merge differs from merge patch in lists: lists of objects with a ``name`` merge by name (the patch
strategy of containers, volumes, resourceClaims, requests...), ``$patch: delete``/``replace`` and the
``$setElementOrder``/``$retainKeys``/``$deleteFromPrimitiveList`` directives are understood; other lists are
replaced, as merge patch does. Server-side apply (``application/apply-patch+yaml``) is ``kube.apply``'s.
"""
from __future__ import annotations

import copy
from typing import Any

from draservice.requests import merge_patch
from kube.status import KubeError

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def apply_patch(current: dict, patch: Any, content_type: str) -> dict:
    ctype = content_type.split(";")[0].strip()
    if ctype == MERGE:
        if not isinstance(patch, dict):
            raise KubeError(400, "a merge patch must be a JSON object")
        return merge_patch(copy.deepcopy(current), patch)
    if ctype == STRATEGIC:
        if not isinstance(patch, dict):
            raise KubeError(400, "a strategic merge patch must be a JSON object")
        return strategic_merge(copy.deepcopy(current), patch)
    if ctype == JSON_PATCH:
        return json_patch(copy.deepcopy(current), patch)
    raise KubeError(415, f"the body of the request was in an unknown format - accepted media types include: "
                         f"{JSON_PATCH}, {MERGE}, {STRATEGIC}, {APPLY}")


def _merge_key(items: list) -> str | None:
    if items and all(isinstance(i, dict) and "name" in i for i in items):
        return "name"
    return None


def strategic_merge(current: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(current, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    out = dict(current)
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            out[field] = [v for v in out.get(field) or [] if v not in value]
            continue
        if value is None or isinstance(value, dict) and value.get("$patch") == "delete":
            out.pop(key, None)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value)
        elif isinstance(value, dict):
            out[key] = strategic_merge(out.get(key) if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merge_list(current: list, patch: list) -> list:
    key = _merge_key(patch) or _merge_key(current)
    if key is None or not _merge_key(current + [p for p in patch if not (isinstance(p, dict) and "$patch" in p)]):
        return copy.deepcopy([p for p in patch if not (isinstance(p, dict) and p.get("$patch"))])
    merged = {item[key]: item for item in current}
    order = [item[key] for item in current]
    for item in patch:
        if item.get("$patch") == "delete":
            merged.pop(item.get(key), None)
            continue
        name = item[key]
        merged[name] = strategic_merge(merged.get(name, {}), item)
        if name not in order:
            order.append(name)
    return [merged[n] for n in order if n in merged]


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KubeError(422, f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise KubeError(400, "a JSON patch must be a list of operations")
    for i, op in enumerate(ops):
        try:
            doc = _json_patch_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise KubeError(422, f"the JSON patch's operation {i} could not be applied: {exc}") from None
    return doc


def _json_patch_op(doc: Any, op: dict) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "test":
        target = _parent(doc, parts + ["x"]) if parts else doc
        if target != op["value"]:
            raise ValueError("test failed")
        return doc
    if kind in ("move", "copy"):
        src = _pointer(op["from"])
        value = copy.deepcopy(_parent(doc, src + ["x"]))
        if kind == "move":
            doc = _json_patch_op(doc, {"op": "remove", "path": op["from"]})
        return _json_patch_op(doc, {"op": "add", "path": op["path"], "value": value})
    if not parts:
        return copy.deepcopy(op["value"]) if kind in ("add", "replace") else None
    parent, last = _parent(doc, parts), parts[-1]
    if kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    elif kind in ("add", "replace"):
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            else:
                parent[index] = copy.deepcopy(op["value"])
        else:
            if kind == "replace" and last not in parent:
                raise KeyError(last)
            parent[last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"unknown op {kind!r}")
    return doc
