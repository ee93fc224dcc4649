"""Reservations API: fleet-wide ``draservice.io/v1alpha1`` Reservation objects. Admins write; everyone reads
the ones they may use (a namespace token: those whose ``spec.users`` name one of its namespaces or their queue).

Thin views, as the Queue ones: check access, parse (JSON or YAML), call ``queues.services.reservations``,
render with the ETag (``resourceVersion``).
"""
from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from draservice.etag import IF_MATCH_PARAMETER, etag_for, if_match, not_modified
from draservice.pagination import KubeListPagination
from draservice.parsers import JSONParser, MergePatchParser
from draservice.permissions import IsAdminOrReadOnly, access_for
from draservice.yaml import YAMLParser
from queues.models import API_VERSION, Reservation
from queues.services import reservations as services


class ReservationBase(APIView):
    permission_classes = [IsAdminOrReadOnly]
    parser_classes = [JSONParser, YAMLParser, MergePatchParser]

    def handle_exception(self, exc):
        if isinstance(exc, ObjectDoesNotExist):
            exc = exceptions.NotFound("reservation not found")
        return super().handle_exception(exc)

    def render(self, r: Reservation, code: int = 200) -> Response:
        response = Response(services.rendered(r), status=code)
        response["ETag"] = etag_for(r.resource_version)
        return response

    def readable(self, request, name: str) -> Reservation:
        r = Reservation.objects.get(name=name)
        if not services.visible(access_for(request), [r]):
            raise exceptions.NotFound("reservation not found")
        return r


class ReservationListView(ReservationBase):
    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="List Reservations (those the caller may use)")
    def get(self, request):
        paginator = KubeListPagination()
        page = list(paginator.paginate_queryset(Reservation.objects.order_by("id"), request, self) or [])
        items = services.rendered_many(services.visible(access_for(request), page))
        return Response({"apiVersion": API_VERSION, "kind": "ReservationList", "metadata": paginator.list_metadata(),
                         "items": items})

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: OpenApiTypes.OBJECT},
                   summary="Create a Reservation (admins)")
    def post(self, request):
        r = services.create(request.data)
        response = self.render(r, status.HTTP_201_CREATED)
        response["Location"] = f"{request.path.rstrip('/')}/{r.name}"
        return response


class ReservationDetailView(ReservationBase):
    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="Read a Reservation")
    def get(self, request, name):
        r = self.readable(request, name)
        if not_modified(request, r.resource_version):
            response = Response(status=status.HTTP_304_NOT_MODIFIED)
            response["ETag"] = etag_for(r.resource_version)
            return response
        return self.render(r)

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=[IF_MATCH_PARAMETER],
                   responses={200: OpenApiTypes.OBJECT, 201: OpenApiTypes.OBJECT}, summary="Replace a Reservation")
    def put(self, request, name):
        r, created = services.replace(name, request.data, if_match(request))
        return self.render(r, 201 if created else 200)

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=[IF_MATCH_PARAMETER],
                   responses={200: OpenApiTypes.OBJECT}, summary="Change a Reservation (JSON merge patch)")
    def patch(self, request, name):
        return self.render(services.patch(name, request.data, if_match(request)))

    @extend_schema(parameters=[IF_MATCH_PARAMETER], responses={204: None}, summary="Delete a Reservation")
    def delete(self, request, name):
        services.delete(name, if_match(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
