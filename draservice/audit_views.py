"""``GET /api/v1/auditevents``: the policy audit trail (``draservice.audit``), oldest first, admins only.

``?kind=Queue`` (one of ``draservice.audit.KINDS``) and ``?name=team-a`` keep one object's events; an unknown
kind or an over-long name is a 400 naming the parameter. Paginated as every list (``limit``, ``continue``).
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from draservice import audit
from draservice.filters import bad_parameter
from draservice.models import AuditEvent
from draservice.pagination import KubeListPagination
from draservice.permissions import access_for

API_VERSION = "draservice.io/v1alpha1"


class IsAdmin(BasePermission):
    """Admin tokens (read-only ones too) and staff sessions: the trail names tokens and people."""

    message = "Only an admin token may read the audit trail."

    def has_permission(self, request, view) -> bool:
        return access_for(request).is_admin


class AuditEventListView(APIView):
    permission_classes = [IsAdmin]

    @extend_schema(parameters=[OpenApiParameter("kind", OpenApiTypes.STR, enum=list(audit.KINDS)),
                               OpenApiParameter("name", OpenApiTypes.STR)],
                   responses={200: OpenApiTypes.OBJECT}, summary="List policy changes (admins)")
    def get(self, request):
        events = AuditEvent.objects.order_by("id")
        kind, name = request.query_params.get("kind"), request.query_params.get("name")
        errors = []
        if kind is not None and kind not in audit.KINDS:
            errors.append(("kind", f'Unsupported value: "{kind}": supported values: '
                                   + ", ".join(f'"{k}"' for k in audit.KINDS)))
        if name is not None and not 0 < len(name) <= 253:
            errors.append(("name", "Invalid value: must be a name of 1 to 253 characters"))
        if errors:
            raise bad_parameter(errors)
        if kind is not None:
            events = events.filter(kind=kind)
        if name is not None:
            events = events.filter(name=name)
        paginator = KubeListPagination()
        page = list(paginator.paginate_queryset(events, request, self) or [])
        return Response({"apiVersion": API_VERSION, "kind": "AuditEventList", "metadata": paginator.list_metadata(),
                         "items": [audit.rendered(e) for e in page]})
