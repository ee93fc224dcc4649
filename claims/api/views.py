"""Claims API views. Thin: check access, parse, call a service, render.

Long polls (``?wait=``) hold one web thread each while they sleep (no database transaction, a query every
couple of seconds, woken early by ``draservice.notify``). Size the web server's threads for the waiters you
expect: ``manage.py serve`` runs gunicorn's threaded workers (see its ``--threads``), and
``draservice.requests.MAX_WAIT`` caps how long one request may hold a thread.
"""
from __future__ import annotations

from typing import cast

from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from claims import filtersets
from claims.api import serializers as s
from claims.models import (
    ClaimEvent,
    Consumer,
    Namespace,
    Phase,
    ResourceClaim,
    ResourceClaimTemplate,
    UtilisationSnapshot,
)
from claims.placement import body_pin
from claims.services import claims as claim_services
from claims.services import consumers as consumer_services
from claims.services import events as ev
from claims.services import explain as explain_service
from claims.services import idempotency
from claims.services import preemption as claim_preemption
from claims.services import templates as template_services
from draservice import dryrun, idempotent, notify
from draservice.errors import Conflict
from draservice.models import APIToken
from draservice.pagination import KubeListPagination
from draservice.parsers import JSONParser, MergePatchParser
from draservice.permissions import (
    ClaimAccess,
    IsAuthenticatedPrincipal,
    NamespaceAccess,
    access_for,
    readable_namespaces,
)
from draservice.problems import FieldError
from draservice.requests import merge_patch, parse_wait
from draservice.yaml import YAMLParser
from inventory.services.doctor import diagnosed

# Headers are read from request.META: ``request.headers`` builds a mapping of every header on first use.


def _etag(response: Response, obj) -> Response:
    response["ETag"] = obj.etag
    return response


def _claim_or_404(ns: str, name: str) -> ResourceClaim:
    claim = s.load_claim(ns, name)
    if claim is None:  # get_object_or_404's words
        raise Http404("No ResourceClaim matches the given query.")
    dryrun.keep_version(str(claim.resource_version))  # a dry-run update answers the version it did not change
    return claim


class ClaimsBase(generics.GenericAPIView):
    # Who may read or write the URL's namespace is decided before any lookup (draservice.permissions).
    permission_classes = [NamespaceAccess]
    parser_classes = [JSONParser, YAMLParser, MergePatchParser]
    pagination_class = KubeListPagination

    def paginated(self, queryset, render, kind, api_version=None):
        page = self.paginate_queryset(self.filter_queryset(queryset))
        meta = cast(KubeListPagination, self.paginator).list_metadata() if page is not None else {}
        items = render(page if page is not None else queryset)
        return Response(s.render_list(kind, items, api_version or s.k8s.V1, meta))


# --------------------------------------------------------------------------------------------- namespaces

class NamespaceListView(ClaimsBase):
    @extend_schema(operation_id="namespaces_list",
                   responses={200: OpenApiTypes.OBJECT}, summary="Namespaces this caller can read")
    def get(self, request):
        qs = Namespace.objects.all()
        allowed = readable_namespaces(request)
        if allowed is not None:
            qs = qs.filter(name__in=allowed)
        return self.paginated(qs, lambda rows: [{"name": n.name, "labels": n.labels, "created": s.ts(n.created_at)}
                                                for n in rows], "NamespaceList", "v1")


# --------------------------------------------------------------------------------------------- claims

class ClaimListView(ClaimsBase):
    permission_classes = [ClaimAccess]
    filterset_class = filtersets.ResourceClaimFilterSet

    def get_queryset(self):
        return s.claims_queryset(ResourceClaim.objects.filter(namespace__name=self.kwargs["namespace"]))

    @extend_schema(operation_id="resourceclaims_list",
                   responses={200: s.KubeListSerializer}, summary="List ResourceClaims")
    def get(self, request, namespace):
        return self.paginated(self.get_queryset(), s.render_claims, "ResourceClaimList")

    @extend_schema(operation_id="resourceclaims_create",
                   request=s.KubeObjectSerializer, responses={201: s.KubeObjectSerializer},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
                   summary="Create a ResourceClaim (v1, v1beta2 or v1beta1; JSON or YAML)")
    def post(self, request, namespace):
        # Most of these POSTs are answered by claims.api.fastpost without this method's DRF dispatch; both
        # run create_claim.
        return create_claim(request, namespace, request.data, self.check_object_permissions)


def create_claim(request, namespace: str, body, check_object_permissions) -> Response:
    """The claim POST once the caller is authenticated, may write the namespace and the body is parsed: the
    body's own checks (422) before the per-claim access check (403), then the create (Idempotency-Key, Location)."""
    check_object_permissions(request, ClaimAccess.new_claim(body_pin(body)))
    if isinstance(body, dict) and body.get("kind") == "List":
        raise FieldError([("kind", "use …/resourceclaims/batch to create several claims")], status_code=400)

    def create():
        return 201, s.render_new_claims(claim_services.create_claims(namespace, [body]))[0]

    # create_claims is one transaction by itself (one statement for one claim on PostgreSQL).
    with diagnosed(body):
        return idempotent.create_response(request, f"{namespace}:resourceclaims", body, create, idempotency.run,
                                          location=True, atomic=False, refresh=s.current_rendering)


# The methods of one claim, shared by its own view and by the batch view (a claim may be named "batch").
def _read_claim(view: ClaimsBase, request, namespace, name):
    claim = _claim_or_404(namespace, name)
    wait = parse_wait(request.query_params.get("wait"))
    if wait and claim.phase == Phase.PENDING:
        def check():
            phase = s.claim_phase(claim.pk)
            return phase if phase != Phase.PENDING else None  # None: keep waiting (deleted ends it too)

        notify.wait_for(claim.pk, wait, check)
        claim = _claim_or_404(namespace, name)
    return _etag(Response(s.render_claim(claim, list(claim.reservations.all()), estimate=True)), claim)


def _replace_claim(view: ClaimsBase, request, namespace, name):
    claim = _claim_or_404(namespace, name)
    view.check_object_permissions(request, claim)
    claim = claim_services.update_claim(claim.pk, request.data, if_match=request.META.get("HTTP_IF_MATCH"))
    claim = _claim_or_404(namespace, name)
    return _etag(Response(s.render_claim(claim, list(claim.reservations.all()))), claim)


def _patch_claim(view: ClaimsBase, request, namespace, name):
    claim = _claim_or_404(namespace, name)
    view.check_object_permissions(request, claim)
    current = s.render_claim(claim, list(claim.reservations.all()))
    patched = merge_patch(current, request.data)
    patched.pop("status", None)
    claim = claim_services.update_claim(claim.pk, patched, if_match=request.META.get("HTTP_IF_MATCH"))
    claim = _claim_or_404(namespace, name)
    return _etag(Response(s.render_claim(claim, list(claim.reservations.all()))), claim)


def _delete_claim(view: ClaimsBase, request, namespace, name):
    claim = _claim_or_404(namespace, name)
    view.check_object_permissions(request, claim)
    body = s.render_claim(claim, [])
    claim_services.delete_claim(claim.pk, if_match=request.META.get("HTTP_IF_MATCH"))
    return Response(body)


class ClaimBatchView(ClaimsBase):
    permission_classes = [ClaimAccess]
    """POST creates a batch; the other methods are those of a claim that happens to be named "batch"."""

    @extend_schema(exclude=True)
    def get(self, request, namespace, name):
        return _read_claim(self, request, namespace, name)

    @extend_schema(exclude=True)
    def put(self, request, namespace, name):
        return _replace_claim(self, request, namespace, name)

    @extend_schema(exclude=True)
    def patch(self, request, namespace, name):
        return _patch_claim(self, request, namespace, name)

    @extend_schema(exclude=True)
    def delete(self, request, namespace, name):
        return _delete_claim(self, request, namespace, name)

    @extend_schema(operation_id="resourceclaims_batch_create",
                   request=s.KubeListSerializer, responses={201: s.KubeListSerializer},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
                   summary="Create many claims (and Consumers) in one transaction: all or none")
    def post(self, request, namespace, name=None):
        body = request.data
        items = body.get("items") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise FieldError([("items", "must be a list of ResourceClaim (or Consumer) objects")])
        if not items:  # as `kubectl create` refuses an empty List ("no objects passed to create")
            raise FieldError([("items", "Required value: at least one ResourceClaim or Consumer")])
        pins = {body_pin(item) for item in items if isinstance(item, dict) and item.get("kind") != "Consumer"}
        self.check_object_permissions(request, ClaimAccess.new_claim(pins.pop() if len(pins) == 1 else None))

        def create():
            is_consumer = [isinstance(o, dict) and o.get("kind") == "Consumer" for o in items]
            claim_items = [(i, o) for i, o in enumerate(items) if not is_consumer[i]]
            consumer_items = [(i, o) for i, o in enumerate(items) if is_consumer[i]]
            claims = claim_services.create_claims(namespace, [o for _, o in claim_items],
                                                  paths=[f"items[{i}]" for i, _ in claim_items]) if claim_items else []
            consumers = [consumer_services.create_consumer(namespace, o, f"items[{i}]") for i, o in consumer_items]
            if consumers:  # consumers made in this batch reserve some of these claims: read them back
                rendered = s.render_claims(s.claims_queryset(ResourceClaim.objects).filter(
                    id__in=[c.id for c in claims]).order_by("id"))
            else:  # brand-new claims: nothing reserves them yet
                rendered = s.render_new_claims(claims)
            rendered += [s.render_consumer(c) for c in consumers]
            return 201, s.render_list("List", rendered, "v1")

        with diagnosed(body, batch=True):
            return idempotent.create_response(request, f"{namespace}:resourceclaims/batch", body, create,
                                              idempotency.run, refresh=s.current_rendering)


class ClaimDetailView(ClaimsBase):
    permission_classes = [ClaimAccess]
    @extend_schema(operation_id="resourceclaims_read",
                   parameters=[OpenApiParameter("wait", str, description="long poll: return as soon as the claim "
                                                "is no longer Pending, or after this long (e.g. 60s, max 120s)")],
                   responses={200: s.KubeObjectSerializer}, summary="Read a ResourceClaim (optionally wait)")
    def get(self, request, namespace, name):
        return _read_claim(self, request, namespace, name)

    @extend_schema(operation_id="resourceclaims_replace",
                   request=s.KubeObjectSerializer, responses={200: s.KubeObjectSerializer},
                   summary="Replace labels/annotations (spec is immutable); If-Match honoured")
    def put(self, request, namespace, name):
        return _replace_claim(self, request, namespace, name)

    @extend_schema(operation_id="resourceclaims_patch",
                   request=OpenApiTypes.OBJECT, responses={200: s.KubeObjectSerializer},
                   summary="JSON merge patch of labels/annotations; If-Match honoured")
    def patch(self, request, namespace, name):
        return _patch_claim(self, request, namespace, name)

    @extend_schema(operation_id="resourceclaims_delete",
                   responses={200: s.KubeObjectSerializer}, summary="Release the devices and delete the claim")
    def delete(self, request, namespace, name):
        return _delete_claim(self, request, namespace, name)


class ClaimReleaseView(ClaimsBase):
    permission_classes = [ClaimAccess]
    claim_verb = "release"
    @extend_schema(operation_id="resourceclaims_release", request=None, responses={200: s.KubeObjectSerializer},
                   summary="Release the claim's devices now (the claim stays, phase Released)")
    def post(self, request, namespace, name):
        # One read of the claim: locked by name, checked, released; the answer is the row as the release
        # wrote it (changed in memory as written), its reservations read after the commit if it had any.
        released = claim_services.release_named_claim(
            namespace, name, lambda claim: self.check_object_permissions(request, claim),
            if_match=request.META.get("HTTP_IF_MATCH"))
        if released is None:  # get_object_or_404's words
            raise Http404("No ResourceClaim matches the given query.")
        s.attach_reservations(released)
        return _etag(Response(s.render_claim(released, list(released.reservations.all()))), released)


class ClaimReleaseConfirmView(ClaimsBase):
    permission_classes = [ClaimAccess]
    claim_verb = "release"  # a cluster token: claims pinned to or allocated on its cluster

    @extend_schema(operation_id="resourceclaims_release_confirm", request=OpenApiTypes.OBJECT,
                   responses={200: s.KubeObjectSerializer},
                   summary="Confirm that a claim being released (Releasing: a preemption victim, or a release "
                           "later) no longer uses its devices: a victim is requeued and its devices handed over now")
    def post(self, request, namespace, name):
        body = request.data if isinstance(request.data, dict) else {}
        reserved_for = body.get("reservedFor")
        if reserved_for is not None and not isinstance(reserved_for, list):
            raise FieldError([("reservedFor", "must be a list (the cluster claim's status.reservedFor)")])
        access = access_for(request)
        by = claim_preemption.confirmer(access, namespace)
        if reserved_for is not None and access.kind == APIToken.CLUSTER \
                and not claim_preemption.agent_alive(access.cluster_name or ""):
            raise Conflict(f'the agent of cluster "{access.cluster_name}" has sent no heartbeat in the last '
                           f"{int(claim_preemption.AGENT_FRESH.total_seconds())}s: its report is not trusted")
        claim = claim_preemption.confirm(namespace, name, lambda c: self.check_object_permissions(request, c), by,
                                         reserved_for=reserved_for)
        if claim is None:
            raise Http404("No ResourceClaim matches the given query.")
        claim = _claim_or_404(namespace, name)
        return _etag(Response(s.render_claim(claim, list(claim.reservations.all()))), claim)


class ClaimRenewView(ClaimsBase):
    permission_classes = [ClaimAccess]
    claim_verb = "renew"
    @extend_schema(operation_id="resourceclaims_renew",
                   request=s.RenewSerializer, responses={200: s.KubeObjectSerializer},
                   summary="Renew the claim's lease (optionally with a new ttl)")
    def post(self, request, namespace, name):
        claim = _claim_or_404(namespace, name)
        self.check_object_permissions(request, claim)
        ttl = request.data.get("ttl") if isinstance(request.data, dict) else None
        claim_services.renew_lease(claim.pk, ttl=ttl, if_match=request.META.get("HTTP_IF_MATCH"))
        claim = _claim_or_404(namespace, name)
        return _etag(Response(s.render_claim(claim, list(claim.reservations.all()))), claim)


class ClaimExplainView(ClaimsBase):
    @extend_schema(operation_id="resourceclaims_explain",
                   parameters=[OpenApiParameter("refresh", bool, description="run the engine now (no write)")],
                   responses={200: s.ExplainSerializer}, summary="Why a claim is (not) allocated")
    def get(self, request, namespace, name):
        claim = _claim_or_404(namespace, name)
        refresh = request.query_params.get("refresh", "").lower() in ("1", "true", "yes")
        queue = s.queue_status([claim], estimate=True).get(claim.id)
        return Response(explain_service.explain(claim, refresh=refresh, queue=queue))


class ClaimEventsView(ClaimsBase):
    filterset_class = filtersets.ClaimEventFilterSet
    queryset = ClaimEvent.objects.none()  # for the schema; get() builds the real one

    @extend_schema(operation_id="resourceclaims_events", responses={200: s.EventSerializer(many=True)},
                   parameters=[OpenApiParameter("uid", str, description="one claim of this name (after a "
                                                "delete and re-create); default: the current or last one")],
                   summary="The claim's audit trail, oldest first; still there after the claim is deleted")
    def get(self, request, namespace, name):
        qs = ev.trail(namespace, name, request.query_params.get("uid"))
        if qs is None:
            raise Http404(f'no events of resourceclaims "{name}" in namespace "{namespace}"')
        return self.paginated(qs, lambda rows: [s.render_event(e) for e in rows], "EventList", "v1")


class AllClaimsView(ClaimsBase):
    """Claims across namespaces: what the caller may read (the agent filters by ``?cluster=``)."""

    filterset_class = filtersets.ResourceClaimFilterSet
    queryset = ResourceClaim.objects.none()  # for the schema; get() builds the real one

    @extend_schema(operation_id="resourceclaims_list_all_namespaces",
                   responses={200: s.KubeListSerializer}, summary="List ResourceClaims in all readable namespaces")
    def get(self, request):
        qs = s.claims_queryset(ResourceClaim.objects.all())
        allowed = readable_namespaces(request)
        if allowed is not None:
            qs = qs.filter(namespace__name__in=allowed)
        return self.paginated(qs, s.render_claims, "ResourceClaimList")


# --------------------------------------------------------------------------------------------- templates

class TemplateListView(ClaimsBase):
    filterset_class = filtersets.ResourceClaimTemplateFilterSet
    queryset = ResourceClaimTemplate.objects.none()  # for the schema; get() builds the real one

    @extend_schema(operation_id="resourceclaimtemplates_list",
                   responses={200: s.KubeListSerializer}, summary="List ResourceClaimTemplates")
    def get(self, request, namespace):
        qs = ResourceClaimTemplate.objects.select_related("namespace").filter(namespace__name=namespace)
        return self.paginated(qs, lambda rows: [s.render_template(t) for t in rows], "ResourceClaimTemplateList")

    @extend_schema(operation_id="resourceclaimtemplates_create",
                   request=s.KubeObjectSerializer, responses={201: s.KubeObjectSerializer},
                   summary="Create a ResourceClaimTemplate")
    def post(self, request, namespace):
        with diagnosed(request.data):
            template = template_services.create_template(namespace, request.data)
        return _etag(Response(s.render_template(template), status=status.HTTP_201_CREATED), template)


class TemplateDetailView(ClaimsBase):
    def _get(self, namespace, name):
        return get_object_or_404(ResourceClaimTemplate.objects.select_related("namespace"),
                                 namespace__name=namespace, name=name)

    @extend_schema(operation_id="resourceclaimtemplates_read",
                   responses={200: s.KubeObjectSerializer}, summary="Read a ResourceClaimTemplate")
    def get(self, request, namespace, name):
        template = self._get(namespace, name)
        return _etag(Response(s.render_template(template)), template)

    @extend_schema(operation_id="resourceclaimtemplates_delete",
                   responses={200: s.KubeObjectSerializer}, summary="Delete a ResourceClaimTemplate")
    def delete(self, request, namespace, name):
        template = self._get(namespace, name)
        body = s.render_template(template)
        template_services.delete_template(template.pk, if_match=request.META.get("HTTP_IF_MATCH"))
        return Response(body)


# --------------------------------------------------------------------------------------------- consumers

class ConsumerListView(ClaimsBase):
    filterset_class = filtersets.ConsumerFilterSet
    queryset = Consumer.objects.none()  # for the schema; get() builds the real one

    @extend_schema(operation_id="consumers_list", responses={200: s.KubeListSerializer}, summary="List Consumers")
    def get(self, request, namespace):
        qs = (Consumer.objects.select_related("namespace").prefetch_related("reservations__claim")
              .filter(namespace__name=namespace))
        return self.paginated(qs, lambda rows: [s.render_consumer(c, list(c.reservations.all())) for c in rows],
                              "ConsumerList", consumer_services.API_VERSION)

    @extend_schema(operation_id="consumers_create",
                   request=s.KubeObjectSerializer, responses={201: s.KubeObjectSerializer},
                   summary="Create a Consumer: reserves its claims, makes claims from its templates")
    def post(self, request, namespace):

        def create():
            consumer = consumer_services.create_consumer(namespace, request.data)
            return 201, s.render_consumer(consumer)

        return idempotent.create_response(request, f"{namespace}:consumers", request.data, create, idempotency.run,
                                          refresh=s.current_rendering)


class ConsumerDetailView(ClaimsBase):
    def _get(self, namespace, name):
        return get_object_or_404(Consumer.objects.select_related("namespace"), namespace__name=namespace, name=name)

    @extend_schema(operation_id="consumers_read",
                   parameters=[OpenApiParameter("wait", str, description="long poll until all its claims are "
                                                "allocated (or one failed), e.g. 60s")],
                   responses={200: s.KubeObjectSerializer}, summary="Read a Consumer (optionally wait)")
    def get(self, request, namespace, name):
        consumer = self._get(namespace, name)
        wait = parse_wait(request.query_params.get("wait"))
        if wait:
            ids = list(consumer.reservations.values_list("claim_id", flat=True))
            first_pending = ResourceClaim.objects.filter(id__in=ids, phase=Phase.PENDING).order_by("id").first()
            if first_pending is not None:
                def check():
                    pending = ResourceClaim.objects.filter(id__in=ids, phase=Phase.PENDING).exists()
                    return None if pending else True

                # A consumer's pending claims are allocated in one transaction: one of them is wake-up enough.
                notify.wait_for(first_pending.pk, wait, check)
        return _etag(Response(s.render_consumer(consumer)), consumer)

    @extend_schema(operation_id="consumers_delete", responses={200: s.KubeObjectSerializer},
                   summary="Delete a Consumer: unreserves its claims, releases those made for it")
    def delete(self, request, namespace, name):
        consumer = self._get(namespace, name)
        body = s.render_consumer(consumer)
        consumer_services.delete_consumer(consumer.pk, if_match=request.META.get("HTTP_IF_MATCH"))
        return Response(body)


# --------------------------------------------------------------------------------------------- utilisation

class UtilisationView(generics.ListAPIView):
    permission_classes = [IsAuthenticatedPrincipal]
    serializer_class = s.UtilisationSerializer
    filterset_class = filtersets.UtilisationFilterSet
    queryset = UtilisationSnapshot.objects.all()

