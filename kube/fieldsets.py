"""Field sets as structured-merge-diff (sigs.k8s.io/structured-merge-diff v4, what kube-apiserver's server-side
apply is built on) computes them, from the door's one definition per kind (``kube.schemas``). Pure: no Django.

A path is a tuple of FieldsV1 elements: ``f:<field>``, ``k:{"name":"gpu"}`` (an item of a list of type map,
by its keys), ``v:"x"`` (an item of a list of type set). Lists follow the schema's ``x-kubernetes-list-type``
(unset or ``atomic``: the list is one value), maps (``additionalProperties``) and free-form objects
(``x-kubernetes-preserve-unknown-fields``, as upstream's "deduced" type) merge key by key; lists inside
free-form objects are atomic, as upstream deduces them.

As upstream's ToFieldSet: a scalar or atomic value is a member; an item of a list of type map or set is a
member, and so is an entry of a map or free-form object; a field the schema declares is a member only when
it is null or an empty object (otherwise its fields stand for it). FieldsV1 marks a member that also has
members below it with ``".": {}``.
"""
from __future__ import annotations

import copy
import json
from typing import Any

from kube.schema_nodes import Node

Path = tuple[str, ...]
FREE = Node("object", free=True)
MISSING = object()
# Never managed (upstream's fieldmanager strips them): the server sets them, or they name the object.
IGNORED_META = frozenset({"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                          "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"})


def managed_part(obj: dict) -> dict:
    """The part of an object fields are managed in: no apiVersion, kind, status, nor server-set metadata."""
    out = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in IGNORED_META}
    out.pop("metadata", None)
    if meta:
        out["metadata"] = copy.deepcopy(meta)
    return out


def _declared(node: Node, name: str) -> bool:
    return not node.free and node.values is None and any(n == name for n, _ in node.props)


def child(node: Node, elem: str) -> Node:
    if node.free:
        return FREE
    if elem.startswith("f:"):
        if node.values is not None:
            return node.values
        for name, sub in node.props:
            if name == elem[2:]:
                return sub
        return FREE  # not declared: merged as a free-form value
    return node.items or FREE


def _granular_list(node: Node) -> bool:
    return not node.free and node.type == "array" and node.list_type in ("map", "set")


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def item_element(item: Any, node: Node) -> str:
    """The path element of a list item: by its keys in a list of type map, by its value in a set."""
    if node.list_type == "map" and isinstance(item, dict):
        return "k:" + _compact({k: item[k] for k in node.map_keys if k in item})
    return "v:" + _compact(item)


def field_set(obj: dict, node: Node) -> set[Path]:
    """The fields an object (its managed part) sets."""
    out: set[Path] = set()
    _walk(managed_part(obj), node, (), out)
    out.discard(())
    return out


def _walk(value: Any, node: Node, path: Path, out: set[Path]) -> None:
    if isinstance(value, dict):
        if not value:
            out.add(path)
        for key, sub in value.items():
            elem = "f:" + key
            here = path + (elem,)
            if sub is None or sub == {} or not _declared(node, key):
                out.add(here)
            _walk(sub, child(node, elem), here, out)
    elif isinstance(value, list) and _granular_list(node):
        for item in value:
            here = path + (item_element(item, node),)
            out.add(here)
            _walk(item, node.items or FREE, here, out)
    else:
        out.add(path)


def to_fields_v1(paths: set[Path]) -> dict:
    """FieldsV1: a trie of path elements; a member with members below it holds ``".": {}``."""
    root: dict = {}
    for path in sorted(paths):
        node = root
        for elem in path:
            node = node.setdefault(elem, {})
    for path in paths:
        node = root
        for elem in path:
            node = node[elem]
        if node and "." not in node:
            node["."] = {}
    return root


def from_fields_v1(fields: Any, path: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(fields, dict):
        return out
    if path and (not fields or "." in fields):
        out.add(path)
    for elem, sub in fields.items():
        if elem != ".":
            out |= from_fields_v1(sub, path + (elem,))
    return out


def path_string(path: Path) -> str:
    """As upstream prints a path in a conflict: ``.spec.devices[name="gpu"].count``, ``.spec.namespaces[="a"]``."""
    parts = []
    for elem in path:
        kind, text = elem[:2], elem[2:]
        if kind == "f:":
            parts.append("." + text)
        elif kind == "k:":
            keys = json.loads(text)
            parts.append("[" + ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in keys.items()) + "]")
        elif kind == "v:":
            parts.append("[=" + text + "]")
        else:
            parts.append("[" + text + "]")
    return "".join(parts)


def merge(live: Any, config: Any, node: Node) -> Any:
    """The applied configuration over the live object: objects and maps key by key, lists of type map by
    item key and sets by value (live order kept, new items after), anything else replaced."""
    if isinstance(config, dict) and isinstance(live, dict):
        out = dict(live)
        for key, sub in config.items():
            out[key] = merge(live.get(key), sub, child(node, "f:" + key))
        return out
    if isinstance(config, list) and isinstance(live, list) and _granular_list(node):
        items = node.items or FREE
        wanted = {item_element(i, node): i for i in config}
        merged = [merge(i, wanted[e], items) if (e := item_element(i, node)) in wanted else i for i in live]
        seen = {item_element(i, node) for i in live}
        return merged + [copy.deepcopy(i) for i in config if item_element(i, node) not in seen]
    return copy.deepcopy(config)


def value_at(obj: Any, path: Path, node: Node) -> Any:
    for elem in path:
        if elem.startswith("f:"):
            if not isinstance(obj, dict) or elem[2:] not in obj:
                return MISSING
            obj = obj[elem[2:]]
        else:
            if not isinstance(obj, list):
                return MISSING
            obj = next((i for i in obj if item_element(i, node) == elem), MISSING)
            if obj is MISSING:
                return MISSING
        node = child(node, elem)
    return obj


def node_at(node: Node, path: Path) -> Node:
    for elem in path:
        node = child(node, elem)
    return node


def differs(before: Any, after: Any, path: Path, node: Node) -> bool:
    """Whether a member changes: a value replaced as a whole by its content, one with members below it (an
    object, a map entry holding an object, an item of a list of type map) only by appearing or vanishing."""
    old, new = value_at(before, path, node), value_at(after, path, node)
    if old is MISSING or new is MISSING:
        return old is not new
    where = node_at(node, path)
    if isinstance(old, dict) and isinstance(new, dict):
        return False
    if isinstance(old, list) and isinstance(new, list) and _granular_list(where):
        return False
    return bool(old != new)


def remove(obj: dict, paths: set[Path], node: Node) -> dict:
    """The object without these members; objects and lists they leave empty go too."""
    out = copy.deepcopy(obj)
    for path in sorted(paths, key=len, reverse=True):
        _remove(out, path, node)
    return out


def _remove(obj: Any, path: Path, node: Node) -> bool:
    """Removes ``path`` below ``obj``; whether ``obj`` is left empty by it."""
    elem, rest = path[0], path[1:]
    sub_node = child(node, elem)
    if isinstance(obj, dict) and elem.startswith("f:") and elem[2:] in obj:
        key = elem[2:]
        if not rest or (_remove(obj[key], rest, sub_node) and len(path) > 1):
            del obj[key]
    elif isinstance(obj, list) and not elem.startswith("f:"):
        for index, item in enumerate(obj):
            if item_element(item, node) == elem:
                if not rest or _remove(item, rest, sub_node):
                    del obj[index]
                break
    return isinstance(obj, (dict, list)) and not obj
