"""``POST /api/v1/convert``: the manifest doctor. Nothing is stored.

Body: a Kubernetes object, a list of them, or a ``kind: List`` (JSON or YAML; several YAML documents are a
List). Answer: ``{"kind": "DiagnosisList", "items": [diagnosis...]}``, one per object in order, each
``{kind, apiVersion, outcome, explanation, rewrite, changes[, skeleton][, remaining]}`` (``dra.k8s.doctor``);
``outcome`` is valid, rewrite, skeleton or unfixable. 422 only when the body holds no Kubernetes object.
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from dra.k8s.doctor import WorkBudget, diagnose, is_kubernetes_object, objects_in
from draservice.parsers import JSONParser
from draservice.permissions import IsAuthenticatedPrincipal
from draservice.problems import FieldError
from draservice.yaml import YAMLParser
from inventory.services.doctor import fleet_vocabulary

MAX_OBJECTS = 128


class ConvertView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]
    parser_classes = [JSONParser, YAMLParser]

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT},
                   summary="Diagnose DRA manifests written for older APIs and rewrite them for resource.k8s.io/v1 "
                           "(nothing is stored)")
    def post(self, request):
        objects = objects_in(request.data)
        if objects is None or not any(is_kubernetes_object(o) for o in objects):
            raise FieldError([("", "must be a Kubernetes object (with apiVersion and kind), a list of them or a "
                                   "kind: List")])
        if len(objects) > MAX_OBJECTS:
            raise FieldError([("items", f"must have at most {MAX_OBJECTS} items")])
        fleet, budget = fleet_vocabulary(), WorkBudget()  # one parsing budget for the whole body
        items = [diagnose(obj, fleet, budget).as_dict() for obj in objects]
        return Response({"apiVersion": "draservice.io/v1", "kind": "DiagnosisList", "items": items})
