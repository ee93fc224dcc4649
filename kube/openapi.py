"""OpenAPI v3 for kubectl: ``/openapi/v3`` (the index) and one document per group-version.

kubectl 1.32 validates ``apply``/``create`` on the server (``fieldValidation=Strict``) only after finding, in
the group-version's document, a PATCH operation tagged with the kind's ``x-kubernetes-group-version-kind`` that
declares the ``fieldValidation`` query parameter; without it kubectl falls back to client-side validation with
the OpenAPI v2 document. ``/openapi/v2`` is an empty v2 document (``v2``): kubectl then finds no v2 schema for
a kind the v3 documents do not declare (a version the door does not serve) and lets the server answer (``no
matches for kind``) instead of failing with "failed to download openapi". The schemas are structural,
generated from ``kube.schemas`` (the source of ``fieldValidation`` too), so ``kubectl explain`` walks them; the
service's own validation still answers values with field paths.
"""
from __future__ import annotations

import hashlib
import json

from django.http import HttpResponse, JsonResponse

from kube import schema_nodes, schemas
from kube.registry import Resource, groups, in_version
from kube.status import status_response

PREFIX = "/k8s"
WRITE_PARAMS = [
    {"name": "dryRun", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}, "uniqueItems": True},
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}, "uniqueItems": True,
     "description": "Ignore, Warn (the default) or Strict: what to do with unknown fields in the body"},
]


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(r: Resource, version: str) -> str:
    return f"io.draservice.{(r.group or 'core').replace('.', '_')}.{version}.{r.kind}"


def _op(r: Resource, version: str, action: str, params: list | None = None) -> dict:
    ref = {"$ref": f"#/components/schemas/{_schema_name(r, version)}"}
    op = {"operationId": f"{action}{r.kind}", "x-kubernetes-action": action,
          "x-kubernetes-group-version-kind": {"group": r.group, "version": version, "kind": r.kind},
          "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}}
    if params:
        op["parameters"] = params
    if action in ("post", "put", "patch"):
        # No strategic-merge-patch here: kubectl would then compute one from these schemas (and warn that
        # it cannot); without it kubectl sends a JSON merge patch, as for a CRD. Strategic merge patches from
        # kubectl's compiled-in kinds (resource.k8s.io/v1beta1) are still accepted (kube.patch).
        types = ("application/merge-patch+json", "application/json-patch+json") if action == "patch" else (
            "application/json", "application/yaml")
        op["requestBody"] = {"content": {t: {"schema": ref} for t in types}}
    return op


def _paths(r: Resource, version: str) -> dict:
    base = f"/{_gv_path(r.group, version)}"
    ns = "/namespaces/{namespace}" if r.namespaced else ""
    name_params = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    if r.namespaced:
        name_params.append({"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}})
    verbs = r.verbs_in(version)
    collection = {"get": _op(r, version, "list")} if "list" in verbs else {}
    item: dict = {"get": _op(r, version, "get")} if "get" in verbs else {}
    if "create" in verbs:
        collection["post"] = _op(r, version, "post", WRITE_PARAMS)
    if "delete" in verbs:
        item["delete"] = _op(r, version, "delete", WRITE_PARAMS[:1])
    if "deletecollection" in verbs:
        collection["delete"] = _op(r, version, "deletecollection", WRITE_PARAMS[:1] + [
            {"name": "labelSelector", "in": "query", "schema": {"type": "string"}, "uniqueItems": True}])
    if "patch" in verbs or "create" in verbs:
        # kubectl 1.32 looks for fieldValidation on the kind's PATCH operation before any create; a kind that
        # cannot be patched still declares it (the server answers the PATCH itself with 405).
        if "update" in verbs:
            item["put"] = _op(r, version, "put", WRITE_PARAMS)
        item["patch"] = _op(r, version, "patch", WRITE_PARAMS)
    item["parameters"] = name_params
    return {f"{base}{ns}/{r.plural}": collection, f"{base}{ns}/{r.plural}/{{name}}": item}


def _schema(r: Resource, version: str) -> dict:
    schema = schema_nodes.openapi(schemas.definition(r.kind, r.group, version))
    schema["x-kubernetes-group-version-kind"] = [{"group": r.group, "version": version, "kind": r.kind}]
    return schema


def document(group: str, version: str) -> dict | None:
    resources = in_version(group, version)
    if not resources:
        return None
    paths: dict = {}
    for r in resources:
        paths.update(_paths(r, version))
    return {"openapi": "3.0.0", "info": {"title": "draservice", "version": version}, "paths": paths,
            "components": {"schemas": {_schema_name(r, version): _schema(r, version) for r in resources}}}


def _hash(doc: dict) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64].upper()


def index(request):
    paths = {}
    for group, versions in groups().items():
        for version in versions:
            key = _gv_path(group, version)
            doc = document(group, version)
            paths[key] = {"serverRelativeURL": f"{PREFIX}/openapi/v3/{key}?hash={_hash(doc or {})}"}
    return JsonResponse({"paths": paths})


def group_version(request, version: str, group: str = ""):
    doc = document(group, version)
    if doc is None:
        return status_response(404, "the server could not find the requested resource")
    return JsonResponse(doc)


V2_MEDIA_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


def v2(request):
    """An empty ``openapi_v2.Document`` (zero bytes in protobuf, ``{}`` in JSON): every kind is described in v3."""
    if V2_MEDIA_TYPE in request.headers.get("Accept", ""):
        # As kube-openapi answers protobuf: the media type kubectl asks for does not parse as one (the "@").
        return HttpResponse(b"", content_type="application/octet-stream")
    return JsonResponse({"swagger": "2.0", "info": {"title": "draservice", "version": "v2"}, "paths": {}})
