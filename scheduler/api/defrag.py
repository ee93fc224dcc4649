"""``GET /api/v1/defragmentation`` and ``POST /api/v1/defragmentation/plans/{id}/apply``.

Advice is for admins and staff only (any admin token, read-only ones included): a plan names claims of every
namespace, so a namespace or cluster token gets 403 rather than a filtered view that would still reveal
other tenants' claims as the plans' targets. Applying a plan needs a writing admin. Nothing moves by itself:
the GET computes advice (a what-if on a copy of the fleet) and writes nothing.

Query of the GET: ``limit`` (plans shown, 1-50, default 10), ``stranded`` (``false`` skips the stranded
figures, which cost one engine call per node and shape).
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from draservice.permissions import IsAdminToken, access_for
from draservice.problems import FieldError
from scheduler.services import defrag, defrag_apply

MAX_LIMIT = 50
_KNOWN_QUERY = {"limit", "stranded"}


class IsAdminReader(BasePermission):
    message = "defragmentation advice names every namespace's claims: it needs an admin token or a staff user"

    def has_permission(self, request, view) -> bool:
        return access_for(request).is_admin


def _query(params) -> tuple[int, bool]:
    errors = [(k, "Forbidden: unknown query parameter") for k in sorted(set(params) - _KNOWN_QUERY)]
    limit = 10
    raw = params.get("limit")
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            errors.append(("limit", f"Invalid value: {raw!r}: must be an integer from 1 to {MAX_LIMIT}"))
    stranded = params.get("stranded", "true").lower()
    if stranded not in ("true", "false"):
        errors.append(("stranded", f"Invalid value: {stranded!r}: must be true or false"))
    if errors:
        raise FieldError(errors, status_code=400)
    return limit, stranded == "true"


class DefragmentationView(APIView):
    permission_classes = [IsAdminReader]

    @extend_schema(operation_id="defragmentation_advice", responses={200: OpenApiTypes.OBJECT},
                   parameters=[OpenApiParameter("limit", int), OpenApiParameter("stranded", bool)],
                   summary="Stranded free capacity and plans that free a node for a pending claim (nothing moves)")
    def get(self, request):
        limit, stranded = _query(request.query_params)
        out = defrag.advice(stranded=stranded).to_dict()
        out["plans"] = out["plans"][:limit]
        return Response(out)


class ApplyPlanView(APIView):
    permission_classes = [IsAdminToken]

    @extend_schema(operation_id="defragmentation_apply", request=OpenApiTypes.OBJECT,
                   responses={200: OpenApiTypes.OBJECT},
                   summary="Apply a defragmentation plan: move its claims, hold the freed node for its target")
    def post(self, request, plan_id):
        """Body (optional): ``{"graceSeconds": 900}``: how long the old claims keep their devices unless the
        agent or an admin confirms their release sooner (0: released at once)."""
        grace = defrag_apply.parse_body(request.data)
        actor = request.user.get_username() if getattr(request.user, "is_authenticated", False) else "admin token"
        return Response(defrag_apply.apply_plan(plan_id, actor=actor or "admin token", grace=grace))
