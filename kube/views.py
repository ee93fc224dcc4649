"""The /k8s door's resource endpoints: collections, objects and the status subresource of every resource in
``kube.registry``, answered as the Kubernetes API server answers (objects in the version asked for, lists
with ``metadata.resourceVersion``/``continue``, ``Table`` for kubectl, ``Status`` for every error).

Thin, like the API's views: access through the same permission classes (``draservice.permissions``), reads
and writes through ``kube.stores`` (which call the owning services)."""
from __future__ import annotations

import base64
import copy
import json
import logging

from django.http import JsonResponse, StreamingHttpResponse
from rest_framework.permissions import SAFE_METHODS
from rest_framework.views import APIView

from claims.placement import body_pin
from dra.k8s.doctor import diagnose
from draservice import changes, dryrun
from draservice.parsers import JSONParser, MergePatchParser
from draservice.permissions import ClaimAccess, IsAdminOrReadOnly, IsAuthenticatedPrincipal, NamespaceAccess
from draservice.problems import FieldError
from draservice.yaml import YAMLParser
from inventory.services.doctor import diagnosed, fleet_vocabulary, problem_members
from kube import advice, fields, patch, scale, tables, watch
from kube import apply as ssa
from kube.registry import RESOURCE_GROUP, Resource, lookup
from kube.status import KubeError, translate
from kube.stores import STORES, Store

log = logging.getLogger(__name__)
MAX_LIST = 5000  # one page at most, whatever limit asks (the client pages on with continue)


PATCH_ATTEMPTS = 5  # a patch without a precondition retried on a concurrent write (kube-apiserver retries too)


class StrategicMergePatchParser(JSONParser):
    media_type = patch.STRATEGIC


class JSONPatchParser(JSONParser):
    media_type = patch.JSON_PATCH


class ApplyPatchParser(YAMLParser):
    media_type = patch.APPLY  # YAML, or JSON (which is YAML): what kubectl apply --server-side sends


def _unmanaged(body: dict) -> dict:
    """A body for the stores: managedFields are kept beside the object (``kube.apply``), not in it."""
    meta = body.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return body
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _json(body: dict, code: int = 200) -> JsonResponse:
    return JsonResponse(body, status=code, json_dumps_params={"separators": (",", ":")})


def _encode_continue(last_id: int, rv: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"id": last_id, "rv": rv}).encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["id"]), int(data["rv"])
    except (ValueError, KeyError, TypeError):
        raise KubeError(400, "continue key is not valid: illegal base64 data or not a continue token") from None


class ResourceView(APIView):
    """``/k8s/api[s]/{group}/{version}[/namespaces/{namespace}]/{plural}[/{name}[/status]]``."""

    parser_classes = [JSONParser, YAMLParser, MergePatchParser, StrategicMergePatchParser, JSONPatchParser,
                      ApplyPatchParser]
    claim_verb: str | None = None

    # ------------------------------------------------------------------ plumbing
    resource: Resource

    def initial(self, request, *args, **kwargs):
        resource = lookup(kwargs.get("group", ""), kwargs["version"], kwargs["plural"])
        if resource is None or resource.plural not in STORES:
            raise KubeError(404, "the server could not find the requested resource")
        self.resource = resource
        if kwargs["version"] in resource.doctor_only and (request.method != "POST" or "name" in kwargs):
            raise KubeError(404, "the server could not find the requested resource")
        # A namespaced resource is also listed (and watched) across namespaces: /apis/g/v/resourceclaims.
        across = self.resource.namespaced and "namespace" not in kwargs
        if (not self.resource.namespaced and "namespace" in kwargs) or (across and (
                "name" in kwargs or request.method != "GET")):
            raise KubeError(404, "the server could not find the requested resource")
        self.store: Store = STORES[self.resource.plural]
        super().initial(request, *args, **kwargs)

    def get_permissions(self):
        if "namespace" in self.kwargs:
            return [ClaimAccess() if self.kwargs["plural"] == "resourceclaims" else NamespaceAccess()]
        store = STORES.get(self.kwargs.get("plural", ""))
        if self.request.method in SAFE_METHODS or (store and store.anyone_may_create and self.request.method
                                                   == "POST"):
            return [IsAuthenticatedPrincipal()]
        return [IsAdminOrReadOnly()]  # fleet-wide objects: the admins' to write

    def new_claim(self, body):
        return ClaimAccess.new_claim(body_pin(body))

    def handle_exception(self, exc):
        resource = getattr(self, "resource", None)
        name = self.kwargs.get("name") or getattr(self, "body_name", "")
        error = translate(exc, resource.qualified if resource else "", resource.kind if resource else "", name)
        if error is None:
            raise exc
        advice.plain_http_401(self.request, error)
        message = advice.doctor_message(error)
        advice.add_doctor_cause(error)
        response = _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": message, "reason": error.reason,
                          **({"details": error.details} if error.details else {}), "code": error.code}, error.code)
        for key, value in error.headers.items():
            response[key] = value
        for warning in advice.doctor_warnings(error.details) if error.code == 422 else []:
            dryrun.add_warning(response, warning)
        if error.code == 401:
            response["WWW-Authenticate"] = 'Bearer realm="draservice"'
        return response

    def _body(self, request) -> dict:
        body = request.data
        if not isinstance(body, dict):
            raise KubeError(400, "the request body must be a Kubernetes object (a JSON or YAML mapping)")
        return body

    def _check_body(self, body: dict, namespace: str | None, name: str | None = None) -> tuple[dict, list[str]]:
        """apiVersion and kind as the URL says, the URL's namespace and name; unknown fields by
        ``fieldValidation`` (Strict: 400; Warn, the default, and Ignore: dropped, Warn with a warning)."""
        r, version = self.resource, self.kwargs["version"]
        duplicates = getattr(body, "duplicates", ())  # keys a YAML body gave twice (draservice.parsers.Parsed)
        if body.get("apiVersion") not in (None, r.api_version(version)) or body.get("kind") not in (None, r.kind):
            raise KubeError(400, f"the API version in the data ({body.get('apiVersion')}) does not match the "
                                 f"expected API version ({r.api_version(version)})" if body.get("kind") in (
                                     None, r.kind) else f"the kind in the data ({body.get('kind')}) does not "
                                                        f"match the expected kind ({r.kind})")
        meta: dict = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        self.body_name = str(meta.get("name") or "")  # for the error messages
        if namespace and meta.get("namespace") not in (None, "", namespace):
            raise KubeError(400, "the namespace of the provided object does not match the namespace sent on the "
                                 "request")
        if name is not None and meta.get("name") not in (None, name):
            raise KubeError(400, f"the name of the object ({meta.get('name')}) does not match the name on the "
                                 f"URL ({name})")
        body = {**body, "apiVersion": r.api_version(version), "kind": r.kind}
        if namespace:
            body["metadata"] = {**meta, **({"namespace": namespace} if meta else {"namespace": namespace})}
        return fields.validate(body, r.plural, version, self.request.query_params.get("fieldValidation"),
                               duplicates)

    def _respond(self, obj, code: int = 200, warnings: list[str] | None = None, before: dict | None = None,
                 body: dict | None = None):
        """The object as stored; a write (``before``: the object before it, {} for a create) recorded as its
        manager's update in managedFields."""
        rendered = obj if isinstance(obj, dict) else self.store.render(obj, self.kwargs["version"])
        if before is not None:
            ssa.track(self, before, rendered, body)
        else:
            ssa.attach(self.resource, [rendered])
        response = _json(rendered, code)
        for warning in warnings or []:
            dryrun.add_warning(response, warning)
        return response

    def initialize_request(self, request, *args, **kwargs):
        # kube-apiserver reads a body sent without a Content-Type as JSON (the official Python client 37 sends
        # none on create); a PATCH without one is read as a merge patch, the type a plain JSON object means.
        if request.method in ("POST", "PUT", "PATCH") and not request.META.get("CONTENT_TYPE"):
            request.META["CONTENT_TYPE"] = patch.MERGE if request.method == "PATCH" else "application/json"
        return super().initialize_request(request, *args, **kwargs)

    # ------------------------------------------------------------------ verbs
    def get(self, request, **kw):
        if kw.get("subresource") == "scale":
            return _json(scale.get(self, kw))
        if "name" in kw:
            if not self.store.may_get(request, kw["name"]):
                # As kube-apiserver's authorizer answers, before any lookup: the same whether it exists or not.
                # A namespace is its own scope; another cluster-scoped kind is "at the cluster scope".
                scope = (f'in the namespace "{kw["name"]}"' if self.resource.plural == "namespaces"
                         else "at the cluster scope" if not self.resource.namespaced
                         else f'in the namespace "{kw.get("namespace")}"')
                raise KubeError(403, f'{self.resource.qualified} "{kw["name"]}" is forbidden: this token cannot '
                                     f'get resource "{self.resource.plural}" in API group '
                                     f'"{self.resource.qualified.partition(".")[2]}" {scope}', "Forbidden",
                                {"name": kw["name"], "kind": self.resource.plural})
            obj = self.store.get(kw.get("namespace"), kw["name"])
            rendered = self.store.render(obj, kw["version"])
            ssa.attach(self.resource, [rendered])
            if tables.wants_table(request):
                return _json(tables.table(self.resource.plural, [rendered], request.query_params.get(
                    "includeObject") or "Metadata"))
            return _json(rendered)
        if request.query_params.get("watch") in ("1", "true", "True"):
            return self._watch(request, kw)
        return self._list(request, kw)

    def _list(self, request, kw):
        params = request.query_params
        qs = self.store.scoped(request, kw.get("namespace"), params)
        token = params.get("continue")
        rv = None
        if token:
            last_id, rv = _decode_continue(token)
            qs = qs.filter(pk__gt=last_id)
        if rv is None:
            rv = changes.settled()
        try:
            limit = int(params.get("limit") or 0)
        except ValueError:
            raise KubeError(400, f"invalid limit: {params.get('limit')!r}") from None
        limit = MAX_LIST if limit <= 0 else min(limit, MAX_LIST)
        objects = list(qs.order_by("pk")[:limit + 1])
        more = len(objects) > limit
        objects = objects[:limit]
        meta: dict = {"resourceVersion": str(rv)}
        if more:
            meta["continue"] = _encode_continue(objects[-1].pk, rv)
        rendered = self.store.render_many(objects, kw["version"])
        ssa.attach(self.resource, rendered)
        if tables.wants_table(request):
            return _json(tables.table(self.resource.plural, rendered, params.get("includeObject") or "Metadata",
                                      meta))
        return _json({"apiVersion": self.resource.api_version(kw["version"]), "kind": f"{self.resource.kind}List",
                      "metadata": meta, "items": rendered})

    def start_watch(self, request, kw) -> tuple[watch.Watch, int | None]:
        """The watch this request asks for and where it starts, every check done (a 4xx now, not mid-stream).
        Shared with the watch server (``kube.watch_server``), which streams it without holding a thread."""
        watch_class = getattr(self.store, "watch_class", watch.Watch)  # its own, for what the log does not hold
        if (not self.store.change_resource and watch_class is watch.Watch) or "name" in kw:
            raise KubeError(405, f"watch is not supported on {self.resource.qualified}")
        since = watch.parse_resource_version(request.query_params.get("resourceVersion"))
        w = watch_class(self.store, request, kw.get("namespace"), kw["version"], request.query_params,
                        tables.wants_table(request))
        self.store.scoped(request, kw.get("namespace"), request.query_params)  # selectors: a 400 now, not mid-stream
        return w, since

    def _watch(self, request, kw):
        # Served here only where nothing routes watches to the watch server (README, "Watches").
        w, since = self.start_watch(request, kw)
        watch.acquire_slot()
        response = StreamingHttpResponse(w.stream(since), content_type="application/json")
        response["Cache-Control"] = "no-cache"
        return response

    def post(self, request, **kw):
        if "name" in kw:
            raise KubeError(405, "the server does not allow this method on the requested resource")
        ssa.write_options(request.query_params, False)
        original = self._body(request)
        with diagnosed(original):
            body, warnings = self._checked_or_diagnosed(original, kw.get("namespace"))
            obj = self.store.create(self, kw.get("namespace"), _unmanaged(body))
        return self._respond(obj, 201, warnings + self._older_version_advice(original), {}, original)

    def _older_version_advice(self, original: dict) -> list[str]:
        """A manifest in an older DRA version is stored as it is, and the doctor's rewrite is printed."""
        if self.resource.group != RESOURCE_GROUP or self.kwargs["version"] == "v1":
            return []
        return advice.doctor_warnings(problem_members(diagnose(original, fleet_vocabulary())))

    def put(self, request, **kw):
        if kw.get("subresource") == "scale":
            return _json(scale.write(self, request, kw))
        self._object_write_allowed(kw)
        ssa.write_options(request.query_params, False)
        obj = self.store.get(kw.get("namespace"), kw["name"])
        before = self.store.render(obj, kw["version"])
        dryrun.keep_version(before["metadata"].get("resourceVersion"))
        original = self._body(request)
        with diagnosed(original):
            body, warnings = self._checked_or_diagnosed(original, kw.get("namespace"), kw["name"])
            rendered, more = self.replaced(obj, body)
            return self._respond(rendered, 200, warnings + more, before, original)

    def _checked_or_diagnosed(self, body: dict, namespace: str | None, name: str | None = None):
        """``_check_body``; but a manifest written for an older API (a v1beta1-shaped v1 claim has "unknown"
        fields to Strict validation) gets the doctor's 422 with its rewrite rather than a bare 400."""
        try:
            return self._check_body(body, namespace, name)
        except KubeError as exc:
            if exc.code != 400 or "strict decoding error" not in exc.message:
                raise
            members = problem_members(diagnose(body, fleet_vocabulary()))
            if not members.get("rewrite") and not members.get("skeleton"):
                raise
            causes = exc.details.get("causes") or []
            raise FieldError([(c["field"], c["message"]) for c in causes], extra=members) from exc

    def patch(self, request, **kw):
        if kw.get("subresource") == "scale":
            return _json(scale.write(self, request, kw))
        self._object_write_allowed(kw)
        content_type = (request.content_type or "").split(";")[0].strip()
        if content_type == patch.APPLY:
            rendered, code, warnings = ssa.serve(self, request, kw)
            return self._respond(rendered, code, warnings)
        ssa.write_options(request.query_params, False)
        # A patch that names no resourceVersion applies to the object as it is when written: a concurrent
        # write in between (a worker deciding the claim) is retried on the fresh object, as kube-apiserver's
        # GuaranteedUpdate does, a bounded number of times; one that names a version gets its 409.
        for attempt in range(PATCH_ATTEMPTS):
            try:
                return self._patch_once(request, kw, content_type)
            except Exception as exc:  # the service's stale-ETag refusal, as this door says it: a Conflict
                error = exc if isinstance(exc, KubeError) else translate(exc, self.resource.qualified)
                if error is None or error.code != 409 or error.reason != "Conflict" \
                        or self._names_version(request, content_type) or attempt == PATCH_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _names_version(request, content_type: str) -> bool:
        """Whether the patch carries a precondition: If-Match, a JSON patch (it may test the version), or a
        ``metadata.resourceVersion`` in a merge patch."""
        if request.headers.get("If-Match") or content_type == patch.JSON_PATCH:
            return True
        data = request.data if isinstance(request.data, dict) else {}
        meta = data.get("metadata")
        return isinstance(meta, dict) and meta.get("resourceVersion") not in (None, "")

    def _patch_once(self, request, kw, content_type: str):
        obj = self.store.get(kw.get("namespace"), kw["name"])
        before = self.store.render(obj, kw["version"])
        ssa.attach(self.resource, [before])
        current = copy.deepcopy(before)
        current.pop("status", None)
        meta = current.get("metadata") or {}
        version = meta.get("resourceVersion")
        dryrun.keep_version(version)
        if content_type != patch.JSON_PATCH:  # (a JSON patch may test it: kubectl's move to server-side apply)
            meta.pop("resourceVersion", None)  # a patch applies to the object as it is, unless it names one
        patched = patch.apply_patch(current, request.data, request.content_type or "")
        if isinstance(patched, dict) and isinstance(patched.get("metadata"), dict) and patched["metadata"].get(
                "resourceVersion") == version:
            patched["metadata"].pop("resourceVersion")
        if not isinstance(patched, dict):
            raise KubeError(422, "the patched object is not an object")
        patched_meta = patched.get("metadata")
        if not isinstance(patched_meta, dict) or patched_meta.get("name") != kw["name"]:
            # kube-apiserver's checkName after a patch: a patch that drops metadata (or its name) names nothing.
            shown = patched_meta.get("name") if isinstance(patched_meta, dict) else ""
            field = "metadata" if not isinstance(patched_meta, dict) else "metadata.name"
            raise KubeError(400, f"the name of the object ({shown or ''}) does not match the name on the URL "
                                 f"({kw['name']})", "BadRequest",
                            {"name": kw["name"], "kind": self.resource.plural,
                             "causes": [{"reason": "FieldValueRequired", "field": field,
                                         "message": f"Required value: {field} may not be removed by a patch"}]})
        body, warnings = self._check_body(patched, kw.get("namespace"), kw["name"])
        rendered, more = self.replaced(obj, body)
        return self._respond(rendered, 200, warnings + more, before, patched)

    def replaced(self, obj, body: dict) -> tuple[dict, list[str]]:
        """The store's replace; the object as stored after it, and warnings."""
        warnings = []
        if self.resource.plural == "deviceclasses":
            before = self.store.render(obj, self.kwargs["version"])
            warnings = advice.selector_change(self.kwargs["name"], before, body)
        stored = self.store.replace(self, obj, _unmanaged(body))
        return self.store.render(stored, self.kwargs["version"]), warnings

    def delete(self, request, **kw):
        if "name" not in kw:
            return self._delete_collection(request, kw)
        self._object_write_allowed(kw)
        obj = self.store.get(kw.get("namespace"), kw["name"])
        rendered = self.store.render(obj, kw["version"])
        dryrun.keep_version(rendered["metadata"].get("resourceVersion"))
        self.store.delete(self, obj)
        ssa.forget(self.resource, rendered)
        return _json(rendered)

    def _delete_collection(self, request, kw):
        """``deletecollection`` (``kubectl delete resourceclaims -l team=a``, ``--all``): each object the
        selectors match, as one delete each (its own checks and events); the answer lists what was deleted."""
        if "delete" not in self.resource.verbs:
            raise KubeError(405, "the server does not allow this method on the requested resource")
        objects = list(self.store.scoped(request, kw.get("namespace"), request.query_params).order_by("pk")[
            :MAX_LIST])
        rendered = self.store.render_many(objects, kw["version"])
        for obj in objects:
            self.body_name = getattr(obj, "name", "")
            self.store.delete(self, obj)
        for each in rendered:
            ssa.forget(self.resource, each)
        return _json({"apiVersion": self.resource.api_version(kw["version"]), "kind": f"{self.resource.kind}List",
                      "metadata": {}, "items": rendered})

    def _object_write_allowed(self, kw) -> None:
        if "name" not in kw:
            raise KubeError(405, "the server does not allow this method on the requested resource")
        if kw.get("subresource") == "status":
            raise KubeError(405, f"{self.resource.qualified}/status is written by the service only")
        if kw.get("subresource") == "scale":
            raise KubeError(405, "the server does not allow this method on the requested resource")


def not_found(request, *args, **kwargs):
    return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": "the server could not find the requested resource", "reason": "NotFound",
                  "details": {}, "code": 404}, 404)

