"""Inventory API views: declarative viewsets; every write goes through ``inventory.services``."""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.services.figures.fleet import accelerator_summary
from draservice.etag import IF_MATCH_PARAMETER, etag_for, if_match, not_modified
from draservice.permissions import (
    CanWriteClusterInventory,
    IsAdminOrReadOnly,
    IsAuthenticatedPrincipal,
    token_can_read_namespace,
)
from draservice.yaml import YAMLParser
from inventory import filtersets
from inventory.api import serializers as s
from inventory.api.parsers import FastJSONParser
from inventory.hooks import allocation_states
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node, Pool, PoolEvent, ResourceSlice
from inventory.services import clusters as cluster_services
from inventory.services import fleet, sync
from inventory.services.doctor import diagnosed
from inventory.services.taints import rule_taints

PROBLEM = OpenApiResponse(description="application/problem+json with field paths")
NAME_REGEX = r"[^/]+"
SYNC_PARSERS = [FastJSONParser, YAMLParser]


# What the mixin is mixed into, for the type checker (at run time a plain mixin, first in the views' bases).
if TYPE_CHECKING:
    _View = APIView
else:
    _View = object


class InventoryViewMixin(_View):
    permission_classes = [IsAuthenticatedPrincipal]

    def handle_exception(self, exc):
        if isinstance(exc, ObjectDoesNotExist):
            exc = exceptions.NotFound(str(exc) or "Not found.")
        return super().handle_exception(exc)

    def with_etag(self, response: Response, version) -> Response:
        response["ETag"] = etag_for(version)
        return response


def _count(model, **outer):
    rows = model.objects.filter(**{k: OuterRef(v) for k, v in outer.items()}).order_by().values(*outer)
    return Coalesce(Subquery(rows.annotate(n=Count("pk")).values("n")[:1], output_field=IntegerField()), 0)


@extend_schema_view(
    create=extend_schema(responses={201: s.ClusterCreatedSerializer, 422: PROBLEM},
                         description="Register a cluster. The response carries its agent token, shown only once."),
    update=extend_schema(parameters=[IF_MATCH_PARAMETER], responses={200: s.ClusterSerializer, 412: PROBLEM}),
    partial_update=extend_schema(parameters=[IF_MATCH_PARAMETER], responses={200: s.ClusterSerializer, 412: PROBLEM}),
    destroy=extend_schema(parameters=[IF_MATCH_PARAMETER], responses={204: None, 412: PROBLEM}),
)
class ClusterViewSet(InventoryViewMixin, viewsets.ModelViewSet):
    """Clusters: admins register and label them; each cluster's agent pushes its inventory."""

    serializer_class = s.ClusterSerializer
    filterset_class = filtersets.ClusterFilterSet
    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "name"
    lookup_url_kwarg = "cluster"
    lookup_value_regex = NAME_REGEX
    ordering_fields = ["id", "name", "last_sync_at", "created_at"]
    ordering = ["id"]

    def get_queryset(self):
        # django-stubs takes the declared (not a column) Cluster.node_count for a clash; Django refuses only fields.
        return Cluster.objects.annotate(node_count=_count(Node, cluster="pk"),  # type: ignore[no-redef]
                                        device_count=_count(Device, cluster="pk"))

    def get_permissions(self):
        if self.action in ("inventory", "heartbeat", "resource_slice", "node"):
            return [CanWriteClusterInventory()]
        return super().get_permissions()

    def retrieve(self, request, *args, **kwargs):
        cluster = self.get_object()
        if not_modified(request, cluster.resource_version):
            return self.with_etag(Response(status=status.HTTP_304_NOT_MODIFIED), cluster.resource_version)
        return self.with_etag(Response(self.get_serializer(cluster).data), cluster.resource_version)

    def perform_create(self, serializer):
        cluster, secret = cluster_services.create_cluster(name=serializer.validated_data["name"],
                                                          labels=serializer.validated_data.get("labels", {}))
        # Read back through the list's queryset: the 201 carries nodeCount/deviceCount (0) like every read.
        serializer.instance = self.get_queryset().get(pk=cluster.pk)
        serializer.instance.token = secret

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if Cluster.objects.filter(name=serializer.validated_data["name"]).exists():
            raise exceptions.ValidationError({"name": ["a cluster with this name already exists"]})
        self.perform_create(serializer)
        data = s.ClusterCreatedSerializer(serializer.instance).data
        created = cast(Cluster, serializer.instance)  # set by perform_create
        return self.with_etag(Response(data, status=status.HTTP_201_CREATED), created.resource_version)

    def update(self, request, *args, **kwargs):
        cluster = self.get_object()
        serializer = self.get_serializer(cluster, data=request.data, partial=kwargs.get("partial", False))
        serializer.is_valid(raise_exception=True)
        cluster = cluster_services.update_cluster(cluster, labels=serializer.validated_data.get("labels"),
                                                  if_match=if_match(request))
        cluster = self.get_queryset().get(pk=cluster.pk)
        return self.with_etag(Response(self.get_serializer(cluster).data), cluster.resource_version)

    def destroy(self, request, *args, **kwargs):
        cluster_services.delete_cluster(self.get_object(), if_match=if_match(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["PUT"], request=s.InventoryPushSerializer,
                   responses={200: s.SyncResultSerializer, 403: PROBLEM, 404: PROBLEM, 422: PROBLEM},
                   description="Replace the cluster's whole inventory (atomic). JSON or YAML; v1, v1beta2 or "
                               "v1beta1 objects; also a Kubernetes List with items.")
    @extend_schema(methods=["GET"], responses={200: s.InventoryPushSerializer},
                   description="The cluster's inventory in the shape a push takes.")
    @action(detail=True, methods=["get", "put"], url_path="inventory", parser_classes=SYNC_PARSERS)
    def inventory(self, request, cluster=None):
        if request.method == "PUT":
            return Response(sync.push_inventory(cluster, request.data))
        target = Cluster.objects.get(name=cluster)
        return Response({
            "resourceSlices": list(ResourceSlice.objects.filter(cluster=target).order_by("name")
                                   .values_list("object", flat=True)),
            "nodes": [{"name": n, "labels": lab} for n, lab in
                      Node.objects.filter(cluster=target).order_by("name").values_list("name", "labels")],
            "deviceClasses": list(DeviceClass.objects.filter(cluster=target).order_by("name")
                                  .values_list("object", flat=True)),
            "deviceTaintRules": list(DeviceTaintRule.objects.filter(cluster=target).order_by("name")
                                     .values_list("object", flat=True)),
        })

    @extend_schema(request=s.HeartbeatSerializer, responses={200: s.ClusterSerializer})
    @action(detail=True, methods=["post"], url_path="heartbeat")
    def heartbeat(self, request, cluster=None):
        data = request.data if isinstance(request.data, dict) else {}
        body = s.HeartbeatSerializer(data=data)
        body.is_valid(raise_exception=True)
        # Agents send their metrics either under "status" or as the body's other keys: keep them as given.
        status_doc = body.validated_data.get("status")
        if status_doc is None:
            status_doc = {k: v for k, v in data.items() if k != "agentVersion"}
        target = cluster_services.record_heartbeat(Cluster.objects.get(name=cluster),
                                                   agent_version=body.validated_data.get("agentVersion", ""),
                                                   status=status_doc)
        return Response(s.ClusterSerializer(self.get_queryset().get(pk=target.pk)).data)

    @extend_schema(methods=["PUT"], request=s.KubeObjectInputSerializer,
                   responses={200: OpenApiTypes.OBJECT, 201: OpenApiTypes.OBJECT, 412: PROBLEM, 422: PROBLEM})
    @extend_schema(methods=["GET"], responses={200: OpenApiTypes.OBJECT})
    @extend_schema(methods=["DELETE"], responses={204: None})
    @action(detail=True, methods=["get", "put", "delete"], url_path=r"resourceslices/(?P<slice_name>[^/]+)",
            parser_classes=SYNC_PARSERS)
    def resource_slice(self, request, cluster=None, slice_name=None):
        """One ResourceSlice as a Kubernetes object (the agent's incremental sync). ETag: content hash."""
        if request.method == "PUT":
            row, created = sync.put_resource_slice(cluster, slice_name, request.data, if_match(request))
            response = Response(row.object, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
        elif request.method == "DELETE":
            sync.delete_resource_slice(cluster, slice_name, if_match(request))
            return Response(status=status.HTTP_204_NO_CONTENT)
        else:
            row = ResourceSlice.objects.get(cluster__name=cluster, name=slice_name)
            if not_modified(request, row.content_hash[:16]):
                return self.with_etag(Response(status=status.HTTP_304_NOT_MODIFIED), row.content_hash[:16])
            response = Response(row.object)
        return self.with_etag(response, row.content_hash[:16])

    @extend_schema(methods=["PUT"], request=OpenApiTypes.OBJECT, responses={200: s.NodeSerializer,
                                                                            201: s.NodeSerializer})
    @extend_schema(methods=["GET"], responses={200: s.NodeSerializer})
    @extend_schema(methods=["DELETE"], responses={204: None})
    @action(detail=True, methods=["get", "put", "delete"], url_path=r"nodes/(?P<node_name>[^/]+)")
    def node(self, request, cluster=None, node_name=None):
        """One node: ``{"name", "labels"}`` or a core/v1 Node (name and labels are kept)."""
        if request.method == "PUT":
            row, created = sync.put_node(cluster, node_name, request.data)
            return Response(s.NodeSerializer(row).data, status=status.HTTP_201_CREATED if created else 200)
        if request.method == "DELETE":
            sync.delete_node(cluster, node_name)
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(s.NodeSerializer(Node.objects.select_related("cluster").get(
            cluster__name=cluster, name=node_name)).data)


class NodeViewSet(InventoryViewMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Node.objects.select_related("cluster")
    serializer_class = s.NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    ordering_fields = ["id", "name", "updated_at"]
    ordering = ["id"]


class ResourceSliceViewSet(InventoryViewMixin, viewsets.ReadOnlyModelViewSet):
    queryset = ResourceSlice.objects.select_related("cluster")
    serializer_class = s.ResourceSliceSerializer
    filterset_class = filtersets.ResourceSliceFilterSet
    ordering_fields = ["id", "name", "driver", "pool_name", "node_name", "updated_at"]
    ordering = ["id"]


class PoolViewSet(InventoryViewMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Pool.objects.select_related("cluster")
    serializer_class = s.PoolSerializer
    filterset_class = filtersets.PoolFilterSet
    ordering_fields = ["id", "driver", "name", "state", "updated_at"]
    ordering = ["id"]

    @extend_schema(responses={200: s.PoolEventSerializer(many=True)}, filters=False,
                   description="The pool's events, oldest first (e.g. GenerationRegressed: a full push took the "
                               "pool's generation backwards; accepted, and recorded here).")
    @action(detail=True, methods=["get"], url_path="events", filterset_class=None, ordering=["id"],
            ordering_fields=["id"])
    def events(self, request, pk=None):
        pool = self.get_object()
        rows = PoolEvent.objects.select_related("cluster").filter(cluster_id=pool.cluster_id, driver=pool.driver,
                                                                  pool=pool.name)
        page = self.paginate_queryset(self.filter_queryset(rows))
        return self.get_paginated_response(s.PoolEventSerializer(page, many=True).data)


class PoolEventViewSet(InventoryViewMixin, viewsets.ReadOnlyModelViewSet):
    """Pool events of the whole fleet (they outlive their pool); filter by cluster, driver, pool, type."""

    queryset = PoolEvent.objects.select_related("cluster")
    serializer_class = s.PoolEventSerializer
    filterset_class = filtersets.PoolEventFilterSet
    ordering_fields = ["id"]
    ordering = ["id"]


class DeviceViewSet(InventoryViewMixin, viewsets.ReadOnlyModelViewSet):
    """The flattened device view of the fleet: ``taints`` include those of DeviceTaintRules, ``allocation``
    is filled by the claims app (inventory.hooks), showing only the claims of namespaces the caller reads."""

    serializer_class = s.DeviceSerializer
    filterset_class = filtersets.DeviceFilterSet
    ordering_fields = ["id", "name", "driver", "pool_name", "node_name"]
    ordering = ["id"]

    def get_queryset(self):
        pool_state = Pool.objects.filter(cluster=OuterRef("cluster_id"), driver=OuterRef("driver"),
                                         name=OuterRef("pool_name")).values("state")[:1]
        # The slice's stored JSON is large and not shown here: do not fetch it.
        return (Device.objects.select_related("cluster", "resource_slice").defer("resource_slice__object")
                .annotate(pool_state=Subquery(pool_state)))

    def get_serializer_context(self):
        return {**super().get_serializer_context(), **getattr(self, "_page_context", {})}

    def _prepare(self, devices: list) -> None:
        """What the page's rows need besides their columns: two queries for the whole page."""
        states = allocation_states(devices)
        for state in states.values():
            if "claims" in state:
                visible = [c for c in state["claims"]
                           if token_can_read_namespace(self.request, c.get("namespace") or "")]
                state["claimCount"] = len(state["claims"])  # the state is true even when names are hidden
                state["claims"] = visible
        self._page_context = {"allocation_states": states, "rule_taints": rule_taints(devices)}

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        self._prepare(list(page) if page is not None else [])
        return page

    def retrieve(self, request, *args, **kwargs):
        device = self.get_object()
        self._prepare([device])
        return Response(self.get_serializer(device).data)

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, filters=False)
    @action(detail=False, methods=["get"], url_path="summary", filterset_class=None, pagination_class=None)
    def summary(self, request):
        """The fleet's accelerators (one per physical GPU; helper devices not counted) in the four exclusive
        states free, partial, allocated and unavailable, in total and per cluster: the dashboard's numbers."""
        return Response(accelerator_summary())


class FleetObjectViewSet(InventoryViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                         viewsets.GenericViewSet):
    """Fleet-wide objects by name (admin CRUD, ETag/If-Match); the list also shows cluster-pushed ones."""

    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "name"
    lookup_value_regex = NAME_REGEX
    ordering_fields = ["id", "name", "updated_at"]
    ordering = ["id"]
    model: type[DeviceClass] | type[DeviceTaintRule]  # each subclass's

    def get_queryset(self):
        queryset = self.model.objects.select_related("cluster")
        if self.action != "list":
            queryset = queryset.filter(cluster__isnull=True)  # detail URLs address fleet-wide objects
        return queryset

    def retrieve(self, request, *args, **kwargs):
        row = self.get_object()
        if not_modified(request, row.resource_version):
            return self.with_etag(Response(status=status.HTTP_304_NOT_MODIFIED), row.resource_version)
        return self.with_etag(Response(self.get_serializer(row).data), row.resource_version)

    def create(self, request, *args, **kwargs):
        with diagnosed(request.data):
            row = fleet.create_fleet_object(self.model, request.data)
        return self.with_etag(Response(self.get_serializer(row).data, status=status.HTTP_201_CREATED),
                              row.resource_version)

    def update(self, request, *args, **kwargs):
        with diagnosed(request.data):
            row, created = fleet.replace_fleet_object(self.model, kwargs["name"], request.data, if_match(request))
        return self.with_etag(Response(self.get_serializer(row).data, status=201 if created else 200),
                              row.resource_version)

    def destroy(self, request, *args, **kwargs):
        fleet.delete_fleet_object(self.model, kwargs["name"], if_match(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _fleet_docs(serializer):
    return extend_schema_view(
        create=extend_schema(request=s.KubeObjectInputSerializer,
                             responses={201: serializer, 409: PROBLEM, 422: PROBLEM}),
        update=extend_schema(request=s.KubeObjectInputSerializer, parameters=[IF_MATCH_PARAMETER],
                             responses={200: serializer, 201: serializer, 412: PROBLEM, 422: PROBLEM}),
        destroy=extend_schema(parameters=[IF_MATCH_PARAMETER], responses={204: None, 412: PROBLEM}),
    )


@_fleet_docs(s.DeviceClassSerializer)
class DeviceClassViewSet(FleetObjectViewSet):
    """DeviceClasses. Selectors are compiled with dra.cel; a bad one is a 422 at spec.selectors[i].cel.expression."""

    model = DeviceClass
    serializer_class = s.DeviceClassSerializer
    filterset_class = filtersets.DeviceClassFilterSet
    http_method_names = ["get", "post", "put", "delete", "head", "options"]


@_fleet_docs(s.DeviceTaintRuleSerializer)
class DeviceTaintRuleViewSet(FleetObjectViewSet):
    model = DeviceTaintRule
    serializer_class = s.DeviceTaintRuleSerializer
    filterset_class = filtersets.DeviceTaintRuleFilterSet
    http_method_names = ["get", "post", "put", "delete", "head", "options"]

