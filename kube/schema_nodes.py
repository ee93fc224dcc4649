"""The vocabulary of the door's object definitions (``kube.schemas``): one tree of ``Node``s per kind, from which
both the OpenAPI v3 schema (``openapi``: what ``kubectl explain`` prints) and the ``fieldValidation`` tree of
``kube.fields`` (``tree``: which fields a body may hold) are generated, so the two cannot disagree."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

ANY = "*"  # kube.fields: a free-form value (a map, opaque parameters, a status the service writes)
LEAF = None


@dataclass(frozen=True)
class Node:
    type: str  # string, integer, boolean, number, object, array, int-or-string
    doc: str = ""
    props: tuple[tuple[str, Node], ...] = ()
    items: Node | None = None
    values: Node | None = None  # a map: additionalProperties
    free: bool = False  # x-kubernetes-preserve-unknown-fields: opaque or not (yet) described
    list_type: str | None = None  # as k8s.io/api's +listType
    map_keys: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    fmt: str | None = None
    enum: tuple[str, ...] = ()
    server_written: bool = False  # status: the service writes it, a body's copy is ignored (never validated)

    def field(self, name: str) -> Node:
        return dict(self.props)[name]


def string(doc: str, fmt: str | None = None, enum: tuple[str, ...] = ()) -> Node:
    return Node("string", doc, fmt=fmt, enum=enum)


def integer(doc: str) -> Node:
    return Node("integer", doc, fmt="int64")


def boolean(doc: str) -> Node:
    return Node("boolean", doc)


def number(doc: str) -> Node:
    return Node("number", doc)


def quantity(doc: str) -> Node:
    """resource.Quantity (``160Gi``, ``2``): upstream's int-or-string."""
    return Node("int-or-string", doc)


def time(doc: str) -> Node:
    return Node("string", doc, fmt="date-time")


def obj(doc: str, required: tuple[str, ...] = (), **props: Node) -> Node:
    return Node("object", doc, props=tuple(props.items()), required=required)


def obj_of(doc: str, props: dict[str, Node], required: tuple[str, ...] = ()) -> Node:
    return Node("object", doc, props=tuple(props.items()), required=required)


def free(doc: str) -> Node:
    return Node("object", doc, free=True)


def string_map(doc: str) -> Node:
    return Node("object", doc, values=Node("string"))


def map_of(value: Node, doc: str) -> Node:
    return Node("object", doc, values=value)


def array(item: Node, doc: str, list_type: str | None = None, keys: tuple[str, ...] = ()) -> Node:
    return Node("array", doc, items=item, list_type=list_type, map_keys=keys)


def status(node: Node) -> Node:
    return replace(node, server_written=True)


def openapi(node: Node) -> dict:
    """The node as a structural OpenAPI v3 schema (inline, as a CRD's: kubectl explain walks it)."""
    out: dict[str, Any] = {}
    if node.type == "int-or-string":
        out["x-kubernetes-int-or-string"] = True
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    else:
        out["type"] = node.type
    if node.doc:
        out["description"] = node.doc
    if node.fmt:
        out["format"] = node.fmt
    if node.enum:
        out["enum"] = list(node.enum)
    if node.props:
        out["properties"] = {name: openapi(child) for name, child in node.props}
    if node.required:
        out["required"] = list(node.required)
    if node.values is not None:
        out["additionalProperties"] = openapi(node.values)
    if node.free:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if node.items is not None:
        out["items"] = openapi(node.items)
    if node.list_type:
        out["x-kubernetes-list-type"] = node.list_type
    if node.map_keys:
        out["x-kubernetes-list-map-keys"] = list(node.map_keys)
    return out


def tree(node: Node) -> Any:
    """The node as a ``kube.fields`` tree: a dict of known fields, ``[tree]`` for a list of objects, ``ANY``
    for free-form values, ``LEAF`` for scalars and lists of scalars."""
    if node.server_written or node.free or node.values is not None:
        return ANY
    if node.type == "object":
        return {name: tree(child) for name, child in node.props} if node.props else ANY
    if node.type == "array" and node.items is not None:
        inner = tree(node.items)
        return [inner] if isinstance(inner, dict) else (ANY if inner is ANY else LEAF)
    return LEAF
