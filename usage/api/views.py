"""Usage API: the device-hours report (JSON or CSV), a node's or device's history, and the price table.

Thin views: parse the query, check access (``draservice.permissions``: everyone authenticated reads, a namespace
token only its namespaces' usage; admins write prices), call ``usage.services``, render.
"""
from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from draservice.etag import IF_MATCH_PARAMETER, etag_for, if_match
from draservice.pagination import KubeListPagination
from draservice.parsers import JSONParser
from draservice.permissions import IsAdminOrReadOnly, IsAuthenticatedPrincipal, readable_namespaces
from draservice.problems import FieldError
from draservice.yaml import YAMLParser
from usage.api.renderers import CSVRenderer
from usage.models import Price
from usage.services import prices
from usage.services import reports as r

API_VERSION = prices.API_VERSION
CSV_VALUES = ["deviceHours", "deviceSeconds", "cost", "currency", "unpricedDeviceHours"]
SINCE = OpenApiParameter("since", OpenApiTypes.DATETIME, description="RFC 3339; default: the first of this month")
UNTIL = OpenApiParameter("until", OpenApiTypes.DATETIME, description="RFC 3339; default (and at most): now")
GROUP_BY = OpenApiParameter("groupBy", OpenApiTypes.STR,
                            description=f"comma-separated, of: {', '.join(r.GROUPS)} (default: namespace)")
FILTERS = [OpenApiParameter(g, OpenApiTypes.STR, description=f"only these values of {g} (comma-separated)")
           for g in r.GROUPS]


class UsageView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]
    renderer_classes = [JSONRenderer, CSVRenderer]

    @extend_schema(parameters=[GROUP_BY, SINCE, UNTIL, *FILTERS], responses={200: OpenApiTypes.OBJECT},
                   summary="Device-hours and cost per namespace, queue, cluster, product or sharing mode")
    def get(self, request):
        now = timezone.now()
        groups = r.parse_group_by(request.query_params.get("groupBy"))
        window = r.parse_window(request.query_params.get("since"), request.query_params.get("until"), now)
        filters = r.parse_filters(request.query_params)
        report = r.usage(window, groups, readable_namespaces(request), now, filters)
        if getattr(request.accepted_renderer, "format", "") == "csv":
            response = Response({"columns": [*groups, *CSV_VALUES], "items": report["items"]})
            stamp = f"{report['since']}_{report['until']}".replace(":", "")
            response["Content-Disposition"] = f'attachment; filename="usage_{stamp}.csv"'
            return response
        return Response({"apiVersion": API_VERSION, "kind": "UsageReport", **report})


class UsageHistoryView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(parameters=[OpenApiParameter("cluster", OpenApiTypes.STR, required=True),
                               OpenApiParameter("node", OpenApiTypes.STR),
                               OpenApiParameter("device", OpenApiTypes.STR,
                                                description="a device name, or driver/pool/name"), SINCE, UNTIL],
                   responses={200: OpenApiTypes.OBJECT}, summary="The usage intervals of one node or device")
    def get(self, request):
        q = request.query_params
        cluster, node, device = (q.get(k, "").strip() for k in ("cluster", "node", "device"))
        errors = []
        if not cluster:
            errors.append(("cluster", "Required value"))
        if not node and not device:
            errors.append(("node", "Required value: give node or device"))
        if errors:
            raise FieldError(errors, status_code=400, title="Bad Request")
        window = None
        if q.get("since") or q.get("until"):
            window = r.parse_window(q.get("since") or "1970-01-01T00:00:00Z", q.get("until"), timezone.now())
        paginator = KubeListPagination()
        qs = r.history(cluster, node, device, window, readable_namespaces(request))
        page = list(paginator.paginate_queryset(qs, request, self) or [])
        return Response({"apiVersion": API_VERSION, "kind": "UsageIntervalList", "metadata": paginator.list_metadata(),
                         "items": [r.render_interval(i) for i in page]})


class PriceBase(APIView):
    permission_classes = [IsAdminOrReadOnly]
    parser_classes = [JSONParser, YAMLParser]

    def handle_exception(self, exc):
        if isinstance(exc, ObjectDoesNotExist):
            exc = exceptions.NotFound("price not found")
        return super().handle_exception(exc)

    @staticmethod
    def render(price: Price, code: int = 200) -> Response:
        response = Response({"apiVersion": API_VERSION, "kind": "Price", **prices.render(price)}, status=code)
        response["ETag"] = etag_for(price.resource_version)
        return response


class PriceListView(PriceBase):
    @extend_schema(operation_id="prices_list", responses={200: OpenApiTypes.OBJECT},
                   summary="List prices per device-hour")
    def get(self, request):
        paginator = KubeListPagination()
        page = list(paginator.paginate_queryset(Price.objects.order_by("id"), request, self) or [])
        return Response({"apiVersion": API_VERSION, "kind": "PriceList", "metadata": paginator.list_metadata(),
                         "items": [prices.render(p) for p in page]})

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: OpenApiTypes.OBJECT},
                   summary="Set the price of a product's device-hour, fleet-wide or on one cluster (admins)")
    def post(self, request):
        price = prices.create(request.data)
        response = self.render(price, status.HTTP_201_CREATED)
        response["Location"] = f"{request.path.rstrip('/')}/{price.id}"
        return response


class PriceDetailView(PriceBase):
    @extend_schema(operation_id="prices_read", responses={200: OpenApiTypes.OBJECT}, summary="Read a price")
    def get(self, request, pk):
        return self.render(Price.objects.get(pk=pk))

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=[IF_MATCH_PARAMETER],
                   responses={200: OpenApiTypes.OBJECT}, summary="Replace a price (admins)")
    def put(self, request, pk):
        return self.render(prices.replace(pk, request.data, if_match(request)))

    @extend_schema(parameters=[IF_MATCH_PARAMETER], responses={204: None}, summary="Delete a price (admins)")
    def delete(self, request, pk):
        prices.delete(pk, if_match(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
