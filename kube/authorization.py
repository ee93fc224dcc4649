"""``SelfSubjectAccessReview`` and ``SelfSubjectRulesReview`` (authorization.k8s.io/v1): what ``kubectl auth
can-i`` asks. The answers come from the rules the door itself enforces (``kube.views.ResourceView``'s
permission classes over ``draservice.permissions.Access``), stated once here for a (verb, resource, namespace):

* admin token (or staff user): everything the door serves; read-only: the reads;
* namespace token: reads and (unless read-only) writes its namespaces' objects; reads the fleet-wide kinds;
* cluster token (a cluster's sync agent): reads everything; in a namespace writes claims only, and only those
  pinned to (or allocated in) its own cluster: allowed, with that condition as the reason;
* everyone authenticated creates ResourcePoolStatusRequests (a question, not a change).
"""
from __future__ import annotations

from django.http import JsonResponse
from rest_framework.views import APIView

from draservice.models import APIToken
from draservice.permissions import NO_ACCESS, Access, access_for
from kube import protobuf
from kube.registry import RESOURCES, Resource
from kube.status import KubeError, status_response
from kube.stores import STORES

GROUP_VERSION = "authorization.k8s.io/v1"
READS = ("get", "list", "watch")
NON_RESOURCE_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/openapi/v3", "/openapi/v3/*", "/version",
                     "/version/"]


def _resources(group: str, plural: str) -> list[Resource]:
    return [r for r in RESOURCES if (plural in ("*", r.plural)) and group in ("*", r.group)
            and r.plural in STORES]


def _verbs(r: Resource) -> set[str]:
    return {v for version in r.versions for v in r.verbs_in(version)}


def decide(access: Access, verb: str, r: Resource, namespace: str) -> tuple[bool, str]:
    """(allowed, reason) for one verb on one resource in ``namespace`` ("" = all namespaces / cluster scope)."""
    if access is NO_ACCESS:
        return False, "no credentials"
    if verb != "*" and verb not in _verbs(r):
        return False, f"the door does not serve {verb} on {r.qualified}"
    reading = verb in READS
    if not r.namespaced:
        if reading:
            return True, ""
        if verb == "create" and STORES[r.plural].anyone_may_create:
            return True, ""
        return access.can_write_fleet, "" if access.can_write_fleet else f"only an admin token writes {r.plural}"
    if reading:
        if not namespace:
            return True, ("lists only the token's namespaces" if access.kind == APIToken.NAMESPACE else "")
        allowed = access.can_read_namespace(namespace)
        return allowed, "" if allowed else f'this token may not read namespace "{namespace}"'
    if access.read_only:
        return False, "this token is read-only"
    if access.kind == APIToken.CLUSTER:
        if r.plural == "resourceclaims" and verb in ("create", "update", "patch", "delete") and namespace:
            return True, f'only claims pinned to or allocated in cluster "{access.cluster_name}"'
        return False, f'this token may not write namespace "{namespace}"'
    if not namespace:
        return access.is_admin, "" if access.is_admin else "this token writes only in its namespaces"
    allowed = access.can_write_namespace(namespace)
    return allowed, "" if allowed else f'this token may not write namespace "{namespace}"'


def _review(body: dict, kind: str) -> dict:
    if not isinstance(body, dict) or body.get("kind") not in (None, kind):
        raise KubeError(400, f"the request body must be a {kind}")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise KubeError(422, f'{kind}.authorization.k8s.io "" is invalid: spec: Required value', "Invalid")
    return spec


def access_review(access: Access, spec: dict) -> dict:
    attrs = spec.get("resourceAttributes")
    if not isinstance(attrs, dict):
        non = spec.get("nonResourceAttributes") or {}
        path = str(non.get("path") or "")
        allowed = access is not NO_ACCESS and non.get("verb") == "get" and any(
            path == u or (u.endswith("*") and path.startswith(u[:-1])) for u in NON_RESOURCE_URLS)
        return {"allowed": allowed}
    verb, namespace = str(attrs.get("verb") or ""), str(attrs.get("namespace") or "")
    resources = _resources(str(attrs.get("group") or ""), str(attrs.get("resource") or ""))
    if attrs.get("subresource") not in (None, "", "status") or not resources:
        return {"allowed": False, "reason": "the door does not serve this resource"}
    if attrs.get("subresource") == "status" and verb not in READS:
        return {"allowed": False, "reason": "status is written by the service only"}
    answers = [decide(access, verb, r, namespace) for r in resources]
    allowed = all(a for a, _ in answers)
    reasons = sorted({reason for a, reason in answers if reason and (a == allowed)})
    return {"allowed": allowed, **({"reason": "; ".join(reasons)} if reasons else {})}


def rules_review(access: Access, namespace: str) -> dict:
    # A rule means every group times every resource in it: one rule per (verbs, group).
    by_verbs: dict[tuple[tuple[str, ...], str], list[str]] = {}
    for r in _resources("*", "*"):
        verbs = tuple(sorted(v for v in _verbs(r) if decide(access, v, r, namespace)[0]))
        if verbs:
            by_verbs.setdefault((verbs, r.group), []).append(r.plural)
    rules = [{"verbs": list(verbs), "apiGroups": [group], "resources": sorted(plurals)}
             for (verbs, group), plurals in by_verbs.items()]
    non = [] if access is NO_ACCESS else [{"verbs": ["get"], "nonResourceURLs": NON_RESOURCE_URLS}]
    return {"resourceRules": rules, "nonResourceRules": non, "incomplete": False}


_RESOURCE_ATTRIBUTES = ("namespace", "verb", "group", "version", "resource", "subresource", "name")


def _from_protobuf(raw: bytes, kind: str) -> dict:
    """The review's spec from kubectl's protobuf body (field numbers as k8s.io/api/authorization/v1 declares)."""
    _, sent_kind, own = protobuf.unwrap(raw)
    spec = protobuf.message(protobuf.fields(own), 2) or {}
    if sent_kind != kind:
        return {"kind": sent_kind}
    if kind == "SelfSubjectRulesReview":
        return {"kind": kind, "spec": {"namespace": protobuf.text(spec, 1)}}
    out: dict = {}
    attrs = protobuf.message(spec, 1)
    if attrs is not None:
        out["resourceAttributes"] = {k: protobuf.text(attrs, i) for i, k in enumerate(_RESOURCE_ATTRIBUTES, 1)
                                     if protobuf.text(attrs, i)}
    non = protobuf.message(spec, 2)
    if non is not None:
        out["nonResourceAttributes"] = {"path": protobuf.text(non, 1), "verb": protobuf.text(non, 2)}
    return {"kind": kind, "spec": out}


class ReviewView(APIView):
    """``POST /apis/authorization.k8s.io/v1/selfsubject{access,rules}reviews``: the answer is the review with
    its ``status`` (nothing is stored)."""

    kind = ""

    def post(self, request, *args, **kwargs):
        try:
            if request.content_type.split(";")[0].strip() == protobuf.MEDIA_TYPE:
                spec = _review(_from_protobuf(request.body, self.kind), self.kind)
            else:
                spec = _review(request.data, self.kind)
        except KubeError as error:
            return status_response(error.code, error.message, error.reason)
        access = access_for(request)
        if self.kind == "SelfSubjectAccessReview":
            state = access_review(access, spec)
        else:
            state = rules_review(access, str(spec.get("namespace") or ""))
        return JsonResponse({"kind": self.kind, "apiVersion": GROUP_VERSION,
                             "metadata": {"creationTimestamp": None}, "spec": spec, "status": state}, status=201)


access_reviews = ReviewView.as_view(kind="SelfSubjectAccessReview")
rules_reviews = ReviewView.as_view(kind="SelfSubjectRulesReview")
