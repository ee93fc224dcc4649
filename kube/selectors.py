"""Kubernetes label and field selectors for the /k8s lists (``k8s.io/apimachinery/pkg/labels`` syntax):
``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, comma-separated (AND).
Applied in SQL on the ``labels`` JSON column, with key transforms that PostgreSQL and SQLite both support."""
from __future__ import annotations

import re
from typing import Any

from django.db.models import F, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast

from kube.status import KubeError

MAX_REQUIREMENTS = 64  # one selector's terms: each is a condition in the list's SQL
_SET = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.:-]*)\s*$")


def _split(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_labels(selector: str) -> list[tuple[str, str, list[str]]]:
    """[(key, op, values)] with op one of =, !=, in, notin, exists, !exists; a 400 for what does not parse."""
    out = []
    parts = _split(selector)
    if len(parts) > MAX_REQUIREMENTS:
        raise KubeError(400, f"a selector may have at most {MAX_REQUIREMENTS} requirements, not {len(parts)}")
    for part in parts:
        m = _EQ.match(part)
        if m:
            out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", [m.group(3)]))
            continue
        m = _SET.match(part)
        if not m or (m.group(1) and m.group(3)):
            raise KubeError(400, f"unable to parse requirement: found '{part.strip()}', expected: key, "
                                 "key=value, key!=value, key in (v1,v2), key notin (v1,v2) or !key")
        neg, key, op, values = m.groups()
        if op:
            out.append((key, op, [v.strip() for v in values.split(",") if v.strip()]))
        else:
            out.append((key, "!exists" if neg else "exists", []))
    return out


def filter_labels(qs: QuerySet, selector: str | None, labels: Any = "labels",
                  columns: dict[str, str] | None = None) -> QuerySet:
    """``labels``: the JSON holding the labels (a column name, or an expression such as the stored object's
    ``metadata.labels``); ``columns``: labels the door adds from a column (``draservice.io/cluster``)."""
    if not selector:
        return qs
    for i, (key, op, values) in enumerate(parse_labels(selector)):
        alias = f"_label_{i}"
        if columns and key in columns:
            value: Any = F(columns[key])
        else:
            # Cast: a text comparison on SQLite too, where a bare key transform's equality wants a JSON-encoded
            # right-hand side (the embedded default answered "malformed JSON", a 500, for a row with the key).
            value = Cast(KeyTextTransform(key, labels), TextField())
        qs = qs.alias(**{alias: value})
        present = Q(**{f"{alias}__isnull": False})
        if op == "=":
            qs = qs.filter(**{alias: values[0]})
        elif op == "!=":
            qs = qs.exclude(present & Q(**{alias: values[0]}))
        elif op == "in":
            qs = qs.filter(**{f"{alias}__in": values})
        elif op == "notin":
            qs = qs.exclude(present & Q(**{f"{alias}__in": values}))
        elif op == "exists":
            qs = qs.filter(present)
        else:
            qs = qs.exclude(present)
    return qs


def labels_match(labels: dict, selector: str | None) -> bool:
    """``filter_labels`` for one object in memory (a deleted object's tombstone)."""
    for key, op, values in parse_labels(selector) if selector else ():
        present = key in labels
        value = labels.get(key)
        if op == "=":
            ok = present and value == values[0]
        elif op == "!=":
            ok = not present or value != values[0]
        elif op == "in":
            ok = present and value in values
        elif op == "notin":
            ok = not present or value not in values
        else:
            ok = present == (op == "exists")
        if not ok:
            return False
    return True


def stored_labels(column: str = "object") -> KeyTransform:
    """``metadata.labels`` of an object stored whole in a JSON column (slices, classes)."""
    return KeyTransform("labels", KeyTransform("metadata", column))


def matches_no_labels(selector: str | None) -> bool:
    """Whether an object without labels (an Event here) matches: only when nothing must be present."""
    return labels_match({}, selector)


def parse_fields(selector: str | None, allowed: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """``metadata.name=x,metadata.namespace!=y`` -> {field: (op, value)}; fields not in ``allowed`` are a 400,
    as upstream answers ``field label not supported``."""
    out: dict[str, tuple[str, str]] = {}
    parts = _split(selector or "")
    if len(parts) > MAX_REQUIREMENTS:
        raise KubeError(400, f"a selector may have at most {MAX_REQUIREMENTS} requirements, not {len(parts)}")
    for part in parts:
        m = _EQ.match(part)
        if not m:
            raise KubeError(400, f"invalid field selector: {part.strip()!r}")
        field, op, value = m.groups()
        if field not in allowed:
            raise KubeError(400, f'field label not supported: {field}')
        out[field] = ("!=" if op == "!=" else "=", value)
    return out
