"""``fieldValidation`` for the /k8s door: which fields each kind knows, so that a typo (``deviceClasName``) is
an error with ``Strict`` (what ``kubectl apply`` sends) instead of a silently ignored field, and is dropped
with a ``Warning`` header otherwise (``Warn``, the API server's default; ``Ignore`` drops it quietly).

The trees list the fields of resource.k8s.io v1 (v1beta2 has the same shape) and v1beta1 (a request's fields
directly on it); ``"*"`` marks free-form maps (labels, opaque driver parameters), ``[tree]`` a list of them.
"""
from __future__ import annotations

from typing import Any

from kube.status import KubeError

Tree = Any
ANY = "*"
LEAF = None

METADATA: Tree = {k: LEAF for k in ("name", "generateName", "namespace", "uid", "resourceVersion", "generation",
                                     "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                                     "finalizers")} | {"labels": ANY, "annotations": ANY, "ownerReferences": ANY,
                                                       "managedFields": ANY}
SELECTOR: Tree = {"cel": {"expression": LEAF}}
TOLERATION: Tree = {k: LEAF for k in ("key", "operator", "value", "effect", "tolerationSeconds")}
CAPACITY: Tree = {"requests": ANY}
COMMON: Tree = {"deviceClassName": LEAF, "selectors": [SELECTOR], "allocationMode": LEAF, "count": LEAF,
                "tolerations": [TOLERATION], "capacity": CAPACITY}
SUBREQUEST: Tree = {"name": LEAF, **COMMON}
EXACT: Tree = {**COMMON, "adminAccess": LEAF}
REQUEST_V1: Tree = {"name": LEAF, "exactly": EXACT, "firstAvailable": [SUBREQUEST]}
REQUEST_V1BETA1: Tree = {"name": LEAF, **EXACT, "firstAvailable": [SUBREQUEST]}
CONSTRAINT: Tree = {"requests": LEAF, "matchAttribute": LEAF, "distinctAttribute": LEAF}
CONFIG: Tree = {"requests": LEAF, "opaque": {"driver": LEAF, "parameters": ANY}}


def _claim_spec(request: Tree) -> Tree:
    return {"devices": {"requests": [request], "constraints": [CONSTRAINT], "config": [CONFIG]}}


def _kinds(request: Tree) -> dict[str, Tree]:
    spec = _claim_spec(request)
    top = {"apiVersion": LEAF, "kind": LEAF, "metadata": METADATA}
    return {"resourceclaims": {**top, "spec": spec, "status": ANY},
            "resourceclaimtemplates": {**top, "spec": {"metadata": METADATA, "spec": spec}}}


TREES = {"v1": _kinds(REQUEST_V1), "v1beta2": _kinds(REQUEST_V1), "v1beta1": _kinds(REQUEST_V1BETA1),
         "v1alpha3": _kinds(REQUEST_V1BETA1)}


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
