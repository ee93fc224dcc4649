"""``fieldValidation`` for the /k8s door: which fields each kind knows, so that a typo (``deviceClasName``) is
an error with ``Strict`` (what ``kubectl apply`` sends) instead of a silently ignored field, and is dropped
with a ``Warning`` header otherwise (``Warn``, the API server's default; ``Ignore`` drops it quietly).

The trees are generated from the door's object definitions (``kube.schemas``), the same ones the OpenAPI
documents are generated from: what ``kubectl explain`` shows is what a body may hold. ``"*"`` marks free-form
values (labels, opaque driver parameters, a status the service writes), ``[tree]`` a list of objects.
"""
from __future__ import annotations

from typing import Any

from kube import schema_nodes, schemas
from kube.registry import RESOURCES
from kube.status import KubeError

Tree = Any
ANY = schema_nodes.ANY
LEAF = schema_nodes.LEAF


def _trees() -> dict[str, dict[str, Tree]]:
    """version -> plural -> tree, for every kind with a full definition (workload kinds pass through)."""
    out: dict[str, dict[str, Tree]] = {}
    for r in RESOURCES:
        if r.kind not in schemas.VALIDATED:
            continue
        for version in r.versions:
            if version not in r.doctor_only:
                out.setdefault(version, {})[r.plural] = schema_nodes.tree(schemas.definition(r.kind, r.group,
                                                                                              version))
    return out


TREES = _trees()


def _prune(value: Any, tree: Tree, path: str, unknown: list[str]) -> Any:
    if tree is ANY or tree is LEAF:
        return value
    if isinstance(tree, list):
        if not isinstance(value, list):
            return value
        return [_prune(v, tree[0], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value  # the service's validation names a wrong type
    out = {}
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in tree:
            unknown.append(where)
            continue
        out[key] = _prune(item, tree[key], where, unknown)
    return out


def validate(body: dict, plural: str, version: str, mode: str | None,
             duplicates: list[str] | tuple = ()) -> tuple[dict, list[str]]:
    """The body with unknown fields dropped, and the warnings to send; a 400 under Strict. ``duplicates``: keys
    the YAML text gave twice (``draservice.parsers.Parsed``), refused under Strict as kube-apiserver does."""
    mode = mode or "Warn"
    if mode not in ("Ignore", "Warn", "Strict"):
        raise KubeError(400, f'fieldValidation: unsupported value "{mode}": supported values: "Ignore", "Warn", '
                             '"Strict"')
    if duplicates and mode == "Strict":
        listed = "\n  ".join(duplicates)
        raise KubeError(400, f"strict decoding error: yaml: unmarshal errors:\n  {listed}", "BadRequest",
                        {"causes": [{"reason": "FieldValueDuplicate", "message": d,
                                     "field": d.split('key "', 1)[1].rsplit('"', 1)[0]} for d in duplicates]})
    duplicate_warnings = list(duplicates) if mode == "Warn" else []
    tree = TREES.get(version, {}).get(plural)
    if tree is None:
        return body, duplicate_warnings
    unknown: list[str] = []
    pruned = _prune(body, tree, "", unknown)
    if unknown and mode == "Strict":
        listed = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise KubeError(400, f"strict decoding error: {listed}", "BadRequest",
                        {"causes": [{"reason": "FieldValueUnknown", "message": f'unknown field "{u}"', "field": u}
                                    for u in unknown]})
    warnings = [f'unknown field "{u}"' for u in unknown] if mode == "Warn" else []
    return pruned, duplicate_warnings + warnings
