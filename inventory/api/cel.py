"""CEL for people: lint a selector, and see what it matches in the stored fleet (or in one given device)
before putting it into a DeviceClass or a claim. The same ``dra.cel`` code validates DeviceClasses and
claims when they are created, so what passes here passes there."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from dra.cel import CELCompileError, CELDevice, CELRuntimeError, compile_expression, validate_expression
from draservice.problems import FieldError
from inventory.permissions import IsAuthenticatedPrincipal
from inventory.services.selectors import try_selector

PROBLEM = OpenApiResponse(description="application/problem+json with field paths")


class ValidateRequest(serializers.Serializer):
    expression = serializers.CharField(allow_blank=False, trim_whitespace=False)


class MatchDevice(serializers.Serializer):
    driver = serializers.CharField()
    attributes = serializers.DictField(required=False, default=dict)
    capacity = serializers.DictField(required=False, default=dict)
    allowMultipleAllocations = serializers.BooleanField(required=False, allow_null=True, default=None)


class MatchRequest(ValidateRequest):
    deviceClassName = serializers.CharField(required=False, allow_blank=True, default="",
                                            help_text="also apply this DeviceClass's selectors, as a claim would")
    device = MatchDevice(required=False, help_text="evaluate against this device instead of the stored fleet")


def _compile_or_422(expression: str):
    try:
        return compile_expression(expression)
    except CELCompileError as exc:
        raise FieldError([("expression", str(exc))], title="Invalid CEL expression") from exc


class CELValidateView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(request=ValidateRequest, responses={200: inline_serializer("CELValidateResponse", {
        "valid": serializers.BooleanField(), "issues": serializers.ListField(child=serializers.DictField())}),
        400: PROBLEM})
    def post(self, request):
        body = ValidateRequest(data=request.data)
        body.is_valid(raise_exception=True)
        issues = validate_expression(body.validated_data["expression"])
        return Response({"valid": not any(i.get("severity") == "error" for i in issues), "issues": issues})


class CELMatchView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(request=MatchRequest, responses={200: inline_serializer("CELMatchResponse", {
        "matches": serializers.IntegerField(), "evaluatedDevices": serializers.IntegerField(),
        "byClusterAndProduct": serializers.ListField(child=serializers.DictField())}), 422: PROBLEM})
    def post(self, request):
        body = MatchRequest(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        compiled = _compile_or_422(data["expression"])
        if data.get("device"):
            d = data["device"]
            device = CELDevice(d["driver"], d.get("attributes") or {}, d.get("capacity") or {},
                               d.get("allowMultipleAllocations"))
            try:
                return Response({"matches": int(compiled.evaluate(device)), "evaluatedDevices": 1,
                                 "byClusterAndProduct": [], "error": None})
            except CELRuntimeError as exc:
                return Response({"matches": 0, "evaluatedDevices": 1, "byClusterAndProduct": [],
                                 "error": {"reason": exc.reason, "hint": exc.hint, "message": str(exc)}})
        result = try_selector(data["expression"], device_class=data.get("deviceClassName") or "")
        if data.get("deviceClassName") and result.class_selectors == [] and result.class_matches is None:
            from inventory.models import DeviceClass

            if not DeviceClass.objects.filter(name=data["deviceClassName"]).exists():
                raise FieldError([("deviceClassName", f'device class {data["deviceClassName"]} not found')])
        return Response({
            "matches": result.matches,
            "evaluatedDevices": result.evaluated_devices,
            "distinctShapesEvaluated": result.groups,
            "exhaustive": result.exhaustive,
            "classMatches": result.class_matches,
            "runtimeErrors": result.runtime_errors,
            "runtimeErrorSample": result.runtime_error_sample or None,
            "byClusterAndProduct": result.breakdown,
            "elapsedMs": result.elapsed_ms,
        })
