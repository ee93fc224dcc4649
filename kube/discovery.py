"""Discovery for kubectl and client libraries: ``/version``, ``/api``, ``/apis``, ``/apis/{group}[/{version}]``.

kubectl 1.32 asks ``/api`` and ``/apis`` for aggregated discovery (``apidiscovery.k8s.io/v2``, every group,
version and resource in one answer) and falls back to the older per-group documents when the server answers
plain JSON; both are served, chosen by the Accept header as the API server does.
"""
from __future__ import annotations

from django.http import JsonResponse

from kube.registry import RESOURCES, Resource, groups, in_version
from kube.status import status_response

KUBE_VERSION = {"major": "1", "minor": "35", "gitVersion": "v1.35.0-draservice", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "", "compiler": "",
                "platform": "linux/amd64"}
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"


def _aggregated_version(request) -> str | None:
    """v2 or v2beta1 when the client asks for aggregated discovery (in its order of preference)."""
    for part in request.headers.get("Accept", "").split(","):
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in part.split(";")[1:])}
        if params.get("g") == "apidiscovery.k8s.io" and params.get("as") == "APIGroupDiscoveryList" and \
                params.get("v") in ("v2", "v2beta1"):
            return params["v"]
    return None


def version(request):
    return JsonResponse(KUBE_VERSION)


def _discovered_resource(r: Resource, v: str) -> dict:
    kind = {"group": r.group, "version": v, "kind": r.kind}
    out: dict = {"resource": r.plural, "responseKind": kind, "scope": "Namespaced" if r.namespaced else "Cluster",
           "singularResource": r.singular, "verbs": list(r.verbs_in(v))}
    if r.short_names:
        out["shortNames"] = list(r.short_names)
    if r.categories:
        out["categories"] = list(r.categories)
    if r.status and v not in r.doctor_only:
        out["subresources"] = [{"subresource": "status", "responseKind": kind, "verbs": ["get"]}]
    return out


def _aggregated(request, group_names: list[str], v: str) -> JsonResponse:
    items = []
    for name in group_names:
        versions = [{"version": ver, "freshness": "Current",
                     "resources": [_discovered_resource(r, ver) for r in in_version(name, ver)]}
                    for ver in groups()[name]]
        items.append({"metadata": {"name": name, "creationTimestamp": None}, "versions": versions})
    body = {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{v}", "metadata": {},
            "items": items}
    return JsonResponse(body, content_type=AGGREGATED.format(v=v))


def core(request):
    v = _aggregated_version(request)
    if v:
        return _aggregated(request, [""], v)
    return JsonResponse({"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})


def _group(name: str) -> dict:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in groups()[name]]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def group_list(request):
    names = [g for g in groups() if g]
    v = _aggregated_version(request)
    if v:
        return _aggregated(request, names, v)
    return JsonResponse({"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(n) for n in names]})


def group(request, group: str):
    if group not in groups() or not group:
        return _missing()
    return JsonResponse({"kind": "APIGroup", "apiVersion": "v1", **_group(group)})


def resource_list(request, version: str, group: str = ""):
    resources = in_version(group, version)
    if not resources:
        return _missing()
    listed = []
    for r in resources:
        entry = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                 "verbs": list(r.verbs_in(version))}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        listed.append(entry)
        if r.status and version not in r.doctor_only:
            listed.append({"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                           "kind": r.kind, "verbs": ["get"]})
    gv = f"{group}/{version}" if group else version
    return JsonResponse({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": listed})


def _missing():
    return status_response(404, "the server could not find the requested resource")


__all__ = ["RESOURCES", "core", "group", "group_list", "resource_list", "version"]
