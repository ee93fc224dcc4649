"""Gangs API views. Thin: check access (the claims API's namespace rules), parse, call a service, render."""
from __future__ import annotations

from typing import cast

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.models import Reservation
from claims.services import idempotency
from draservice import idempotent, notify
from draservice.pagination import KubeListPagination
from draservice.parsers import JSONParser
from draservice.permissions import IsAuthenticatedPrincipal, NamespaceAccess, readable_namespaces
from draservice.requests import parse_wait
from draservice.yaml import YAMLParser
from gangs import simulate
from gangs.api import serializers as s
from gangs.filtersets import GangFilterSet
from gangs.models import Gang, GangEvent, GangPhase
from gangs.services import gangs as gang_services
from gangs.spec import API_VERSION


def _gang_or_404(ns: str, name: str) -> Gang:
    return get_object_or_404(Gang.objects.select_related("namespace"), namespace__name=ns, name=name)


def _members(gang: Gang) -> list:
    members = list(gang.members.select_related("consumer").order_by("index"))
    names: dict[int | None, list[str]] = {}  # looked up by a member's consumer_id (None: no consumer yet)
    for consumer_id, claim_name in (Reservation.objects.filter(consumer_id__in=[m.consumer_id for m in members])
                                    .order_by("claim_id").values_list("consumer_id", "claim__name")):
        names.setdefault(consumer_id, []).append(claim_name)
    return [(m, names.get(m.consumer_id, [])) for m in members]


def _detail(gang: Gang) -> Response:
    response = Response(s.render_gang(gang, _members(gang)))
    response["ETag"] = gang.etag
    return response


class GangsBase(generics.GenericAPIView):
    permission_classes = [NamespaceAccess]  # decided from the URL, before any lookup
    parser_classes = [JSONParser, YAMLParser]
    pagination_class = KubeListPagination

    def listed(self, queryset, kind="GangList"):
        queryset = self.filter_queryset(queryset)  # phase (GangFilterSet), fieldSelector
        page = self.paginate_queryset(queryset)
        meta = cast(KubeListPagination, self.paginator).list_metadata() if page is not None else {}
        rows = page if page is not None else queryset
        return Response({"apiVersion": API_VERSION, "kind": kind, "metadata": meta,
                         "items": [s.render_gang(g) for g in rows]})


class GangListView(GangsBase):
    filterset_class = GangFilterSet
    queryset = Gang.objects.none()  # for the schema; get() builds the real one

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="List Gangs", operation_id="list_namespaced_gangs")
    def get(self, request, namespace):
        return self.listed(Gang.objects.select_related("namespace").filter(namespace__name=namespace))

    @extend_schema(request=s.GangSerializer, responses={201: s.GangSerializer},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
                   summary="Create a Gang: its members' consumers and claims, placed all or nothing")
    def post(self, request, namespace):

        def create():
            gang = gang_services.create_gang(namespace, request.data)
            return 201, s.render_gang(gang)

        return idempotent.create_response(request, f"{namespace}:gangs", request.data, create, idempotency.run,
                                          location=True, refresh=s.current_rendering)


class GangDetailView(GangsBase):
    @extend_schema(parameters=[OpenApiParameter("wait", str, description="long poll: return as soon as the gang "
                                                "is no longer Pending, or after this long (e.g. 60s, max 120s)")],
                   responses={200: s.GangSerializer}, summary="Read a Gang (optionally wait for its placement)",
                   operation_id="read_namespaced_gang")
    def get(self, request, namespace, name):
        gang = _gang_or_404(namespace, name)
        wait = parse_wait(request.query_params.get("wait"))
        if wait and gang.phase == GangPhase.PENDING:
            def check():
                phase = Gang.objects.filter(pk=gang.pk).values_list("phase", flat=True).first()
                return phase if phase != GangPhase.PENDING else None

            # Placing or failing a gang changes all its claims in one transaction: one is wake-up enough.
            first = Reservation.objects.filter(consumer__gang_member__gang=gang).order_by("claim_id").first()
            notify.wait_for(first.claim_id if first else -gang.pk, wait, check)
            gang = _gang_or_404(namespace, name)
        return _detail(gang)

    @extend_schema(responses={200: s.GangSerializer},
                   summary="Delete a Gang: release everything, delete its members' consumers and their claims")
    def delete(self, request, namespace, name):
        gang = _gang_or_404(namespace, name)
        body = s.render_gang(gang)
        gang_services.delete_gang(gang.pk, if_match=request.headers.get("If-Match"))
        return Response(body)


class GangReleaseView(GangsBase):
    @extend_schema(request=None, responses={200: s.GangSerializer},
                   summary="Release everything the gang holds (the gang stays, phase Released)")
    def post(self, request, namespace, name):
        gang = _gang_or_404(namespace, name)
        gang_services.release_gang(gang.pk, if_match=request.headers.get("If-Match"))
        return _detail(_gang_or_404(namespace, name))


class GangEventsView(GangsBase):
    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="The gang's audit trail, oldest first")
    def get(self, request, namespace, name):
        gang = _gang_or_404(namespace, name)
        qs = GangEvent.objects.filter(gang_uid=gang.uid)
        page = self.paginate_queryset(qs)
        meta = cast(KubeListPagination, self.paginator).list_metadata() if page is not None else {}
        return Response({"apiVersion": "v1", "kind": "EventList", "metadata": meta,
                         "items": [s.render_event(e) for e in (page if page is not None else qs)]})


class AllGangsView(GangsBase):
    filterset_class = GangFilterSet
    queryset = Gang.objects.none()  # for the schema; get() builds the real one

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="List Gangs in all readable namespaces")
    def get(self, request):
        qs = Gang.objects.select_related("namespace")
        allowed = readable_namespaces(request)
        if allowed is not None:
            qs = qs.filter(namespace__name__in=allowed)
        return self.listed(qs)


class SimulateGangView(APIView):
    """What-if placement of a gang; see ``gangs.simulate`` for the body."""

    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT},
                   summary="Simulate placing a gang (nothing is written)")
    def post(self, request):
        return Response(simulate.run(request.data))
