"""``POST /api/v1/replays`` (a writing admin) -> 202 and a ``Replay``; ``GET /api/v1/replays`` and
``GET /api/v1/replays/{name}`` (admins, read-only ones too): its state (Pending, Running, Succeeded, Failed)
and, once it succeeded, the comparison per queue of what was replayed with what happened
(``scheduler.services.replays``). Replays name every queue's figures: namespace and cluster tokens get 403."""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from draservice import audit
from draservice.pagination import KubeListPagination
from draservice.permissions import access_for
from scheduler.models import Replay
from scheduler.services import replays

API_VERSION = "draservice.io/v1alpha1"


class ReplayAccess(BasePermission):
    message = "Replays show every queue's figures: reading one needs an admin token, starting one a writing admin."

    def has_permission(self, request, view) -> bool:
        access = access_for(request)
        return replays.may_start(access) if request.method == "POST" else replays.may_read(access)


class ReplayListView(APIView):
    permission_classes = [ReplayAccess]

    @extend_schema(operation_id="replays_list", responses={200: OpenApiTypes.OBJECT},
                   summary="List replays (admins), oldest first")
    def get(self, request):
        paginator = KubeListPagination()
        page = list(paginator.paginate_queryset(Replay.objects.order_by("id"), request, self) or [])
        return Response({"apiVersion": API_VERSION, "kind": "ReplayList", "metadata": paginator.list_metadata(),
                         "items": [replays.rendered(r) for r in page]})

    @extend_schema(operation_id="replays_create", request=OpenApiTypes.OBJECT, responses={202: OpenApiTypes.OBJECT},
                   summary="Replay a recorded window under a configuration (runs on a replay worker)")
    def post(self, request):
        """Body: ``{"window": {"start", "end"}, "configuration": {"queues": [{"name", "spec"}], "reservations":
        [...]}, "budgetSeconds"}`` (configuration and budget optional; a spec is a merge patch)."""
        replay = replays.create(request.data, audit.actor()[0])
        return Response(replays.rendered(replay), status=202,
                        headers={"Location": f"/api/v1/replays/{replay.uid}"})


class ReplayDetailView(APIView):
    permission_classes = [ReplayAccess]

    @extend_schema(operation_id="replays_get", responses={200: OpenApiTypes.OBJECT},
                   summary="A replay: its state and, once it succeeded, the comparison per queue")
    def get(self, request, name):
        return Response(replays.rendered(replays.get(name)))
