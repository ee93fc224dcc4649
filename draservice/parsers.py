"""Request body parsers (JSON, YAML) with the checks every body gets, whatever view it is for.

A body is refused with a 400 before any view sees it when it

* is nested deeper than ``MAX_DEPTH`` levels: recursive code (validation, JSON encoding, PostgreSQL's jsonb
  input) would otherwise fail deep inside with a RecursionError, and no Kubernetes object needs more than a
  dozen levels;
* has a NUL character in any key or string: PostgreSQL cannot store one in text or jsonb, so it would fail
  at write time (a DataError, i.e. a 500) after all validation passed;
* is YAML whose aliases expand it to many times its written size ("billion laughs").
"""
from __future__ import annotations

import math
from typing import Any

import orjson
import yaml
from rest_framework.parsers import BaseParser

MAX_DEPTH = 100
ORJSON_MAX_DEPTH = 1024
_JSON_NUL = b"\\u0000"  # a NUL can only reach a parsed JSON string through this escape


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # libyaml's loader if built in
    """YAML as Kubernetes reads it (sigs.k8s.io/yaml converts YAML to JSON first): timestamps and binary stay
    strings, keys become strings, a set is a map of nulls. Python values JSON cannot hold (datetime, bytes,
    set) would otherwise pass validation and fail when stored. A key given twice in one mapping keeps its last
    value, as sigs.k8s.io/yaml does, and is noted in ``duplicates`` (``fieldValidation=Strict`` refuses it)."""

    def __init__(self, stream):
        super().__init__(stream)
        self.duplicates: list[str] = []


class Parsed(dict):
    """A parsed YAML mapping, with the keys the text gave twice: ``line 5: key "name" already set in map``."""

    duplicates: list[str] = []


def _scalar_string(loader, node):
    return loader.construct_scalar(node)


def _json_mapping(loader, node):
    loader.flatten_mapping(node)  # merge keys (<<)
    out: dict[str, Any] = {}
    yield out
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, bool) or key is None:
            key = "true" if key is True else "false" if key is False else "null"
        elif not isinstance(key, str):
            if isinstance(key, (list, dict, set)):
                raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a scalar",
                                                        key_node.start_mark)
            key = str(key)
        if key in out and len(loader.duplicates) < 100:
            loader.duplicates.append(f'line {key_node.start_mark.line + 1}: key "{key}" already set in map')
        out[key] = loader.construct_object(value_node, deep=False)


def _json_set(loader, node):
    out: dict[str, Any] = {}
    yield out
    for key_node, _ in node.value:
        out[str(loader.construct_object(key_node, deep=True))] = None


for _tag in ("timestamp", "binary"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _scalar_string)
_Loader.add_constructor("tag:yaml.org,2002:map", _json_mapping)
_Loader.add_constructor("tag:yaml.org,2002:set", _json_set)
_YAML_LOADER = _Loader


def bad_body(reason: str, field: str = ""):
    # Imported here: DRF loads the parsers while defining APIView, which draservice.problems imports.
    from draservice.problems import FieldError

    return FieldError([(field, reason)], status_code=400, title="Bad Request")


def _too_deep():
    return bad_body(f"Invalid value: the body is nested more than {MAX_DEPTH} levels deep")


def check_tree(data, *, strings: bool = True, max_nodes: int | None = None) -> None:
    """Depth, size and NUL checks over a parsed body, without recursion.

    ``strings=False`` skips the NUL search (the caller knows there is none) and only bounds the depth;
    ``max_nodes`` bounds the values visited (a YAML alias is visited once per use)."""
    stack = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                raise _too_deep()
            if strings and any("\x00" in k for k in value if isinstance(k, str)):
                raise _nul_error(data)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                raise _too_deep()
            stack.extend((v, depth + 1) for v in value)
        elif strings and isinstance(value, str) and "\x00" in value:
            raise _nul_error(data)
        elif isinstance(value, float) and not math.isfinite(value):
            raise bad_body(f"Invalid value: {value}: JSON has no such number")  # YAML's .inf and .nan
        if max_nodes is not None and nodes > max_nodes:
            raise bad_body("Invalid value: excessive aliasing: the YAML expands to more than "
                           f"{max_nodes} values")


def _nul_error(data):
    """The 400 for a NUL, naming where it is (a second, slower walk that tracks paths; errors only)."""
    stack: list = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                shown = str(key).replace("\x00", "\\u0000")
                here = f"{path}.{shown}" if path else shown
                if isinstance(key, str) and "\x00" in key:
                    return bad_body("Invalid value: a key must not contain a NUL character (\\u0000)", here)
                stack.append((item, here))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, str) and "\x00" in value:
            return bad_body("Invalid value: must not contain a NUL character (\\u0000)", path)
    return bad_body("Invalid value: must not contain a NUL character (\\u0000)")


class JSONParser(BaseParser):
    """JSON through orjson (several times faster than the standard library on big inventory pushes)."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        data = loads_bounded(raw)
        if _JSON_NUL in raw:  # without the escape there is no NUL: skip the walk on the common case
            check_tree(data)
        return data


def loads_bounded(raw: bytes):
    """``orjson.loads`` that refuses nesting deeper than ``MAX_DEPTH``, at no extra cost.

    orjson refuses input nested more than ``ORJSON_MAX_DEPTH`` (1,024, documented) levels by itself: the body
    is parsed inside ``ORJSON_MAX_DEPTH - MAX_DEPTH`` extra arrays, so that limit falls exactly at our
    depth. A walk of the parsed tree would cost as much as the parse again (seconds on a big push).

    A body with no more opening brackets than ``MAX_DEPTH`` (any API object but an inventory push) cannot nest
    deeper, and is parsed as it is: the padding costs a hundred times the parse of a small body (0.3 ms)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_body(f"JSON parse error: {exc}") from exc
    pad = ORJSON_MAX_DEPTH - MAX_DEPTH
    try:
        data = orjson.loads(b"[" * pad + raw + b"]" * pad)
        for _ in range(pad):
            if not isinstance(data, list) or len(data) != 1:  # an empty body, or several values
                raise orjson.JSONDecodeError("not one JSON value", "", 0)
            data = data[0]
        return data
    except orjson.JSONDecodeError:
        pass
    try:  # errors only: parse as given, for the message's positions (or to learn it was the depth)
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise _too_deep() from exc
        raise bad_body(f"JSON parse error: {exc}") from exc
    raise _too_deep()


class MergePatchParser(JSONParser):
    media_type = "application/merge-patch+json"


class YAMLParser(BaseParser):
    """YAML (Kubernetes users paste manifests); several documents become a Kubernetes ``List``."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            text = stream.read().decode("utf-8")
            events = _check_yaml_depth(text)  # before composing: the composer recurses once per level
            loader = _YAML_LOADER(text)
            try:
                docs = []
                while loader.check_data():
                    doc = loader.get_data()
                    if doc is not None:
                        docs.append(doc)
            finally:
                loader.dispose()
        except yaml.YAMLError as exc:
            # PyYAML 6.0.4's scanner stops deep flow collections ("[[[...") itself, before any event reaches
            # our check: the same refusal, in the same words.
            if "exceeded maximum nesting depth" in str(exc):
                raise _too_deep() from exc
            raise bad_body(f"YAML parse error: {exc}") from exc
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad_body(f"YAML parse error: {exc}") from exc
        data = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
        # YAML has its own string escapes (\0, \x00) and aliases: always walk. Aliases may repeat parts of the
        # document a few times over, not expand it geometrically.
        check_tree(data, max_nodes=4 * events + 10_000)
        if loader.duplicates and isinstance(data, dict):
            data = Parsed(data)
            data.duplicates = sorted(loader.duplicates, key=lambda d: int(d.split(":", 1)[0].removeprefix("line ")))
        return data


def _check_yaml_depth(text: str) -> int:
    """Bound the nesting on the event stream (the parser keeps its own stack, it does not recurse); returns
    the number of events."""
    depth = events = 0
    for event in yaml.parse(text, Loader=_YAML_LOADER):
        events += 1
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep()
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
    return events
