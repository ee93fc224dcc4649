"""CEL for people: lint a selector, and see what it matches in the stored fleet (or in one given device)
before putting it into a DeviceClass or a claim. The same ``dra.cel`` code validates DeviceClasses and
claims when they are created, so what passes here passes there.

Cost: both endpoints report the expression's estimated worst-case cost per evaluation (``estimatedCost``)
and the budget a stored selector must fit in (``costLimit``), and Kubernetes' own estimate and limit for
comparison. ``cel/match`` refuses (422, ``errors[0].field == "expression"``) an expression over the budget,
as creating a claim or a DeviceClass would, without evaluating it; otherwise the evaluations of one request
share a budget of cost units and wall clock, and when it runs out the answer is a 200 that covers the
devices evaluated so far, with ``truncated: true`` and ``truncatedReason``.
"""
from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from dra.cel import (
    MAX_SELECTOR_COST,
    UPSTREAM_MAX_SELECTOR_COST,
    CELCompileError,
    CELCostLimitExceeded,
    CELDevice,
    CELRuntimeError,
    compile_expression,
    compile_selector,
    validate_expression,
)
from draservice.permissions import IsAuthenticatedPrincipal
from draservice.problems import FieldError
from inventory.services.selectors import REQUEST_COST_BUDGET, try_selector

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
    """Compiled, and within the budget a stored selector must fit in; else 422 on ``expression``."""
    try:
        return compile_selector(expression)
    except CELCostLimitExceeded as exc:
        raise FieldError([("expression", f"Forbidden: {exc.reason}")], title="CEL expression too expensive",
                         detail=f"expression: Forbidden: {exc.reason}; hint: {exc.hint}") from exc
    except CELCompileError as exc:
        raise FieldError([("expression", str(exc))], title="Invalid CEL expression") from exc


def _costs(expression: str) -> dict:
    try:
        compiled = compile_expression(expression)
    except CELCompileError:
        return {"estimatedCost": None, "costLimit": MAX_SELECTOR_COST, "kubernetesEstimatedCost": None,
                "kubernetesCostLimit": UPSTREAM_MAX_SELECTOR_COST}
    return {"estimatedCost": compiled.max_cost, "costLimit": MAX_SELECTOR_COST,
            "kubernetesEstimatedCost": compiled.upstream_max_cost, "kubernetesCostLimit": UPSTREAM_MAX_SELECTOR_COST}


_COSTS = {
    "estimatedCost": serializers.IntegerField(allow_null=True, help_text="worst-case cost units per evaluation"),
    "costLimit": serializers.IntegerField(help_text="the most a stored selector's estimate may be"),
    "kubernetesEstimatedCost": serializers.IntegerField(allow_null=True, help_text="the API server's estimate"),
    "kubernetesCostLimit": serializers.IntegerField(help_text="CELSelectorExpressionMaxCost"),
}


class CELValidateView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(request=ValidateRequest, responses={200: inline_serializer("CELValidateResponse", {
        "valid": serializers.BooleanField(), "issues": serializers.ListField(child=serializers.DictField()),
        **_COSTS}), 400: PROBLEM})
    def post(self, request):
        body = ValidateRequest(data=request.data)
        body.is_valid(raise_exception=True)
        expression = body.validated_data["expression"]
        issues = validate_expression(expression)
        return Response({"valid": not any(i.get("severity") == "error" for i in issues), "issues": issues,
                         **_costs(expression)})


class CELMatchView(APIView):
    permission_classes = [IsAuthenticatedPrincipal]

    @extend_schema(request=MatchRequest, responses={200: inline_serializer("CELMatchResponse", {
        "matches": serializers.IntegerField(), "evaluatedDevices": serializers.IntegerField(),
        "byClusterAndProduct": serializers.ListField(child=serializers.DictField()),
        "truncated": serializers.BooleanField(required=False),
        "truncatedReason": serializers.CharField(required=False, allow_null=True),
        "estimatedCost": serializers.IntegerField(required=False, allow_null=True),
        "costUnits": serializers.IntegerField(required=False, help_text="cost units this request's evaluations used"),
        "costBudget": serializers.IntegerField(required=False, help_text="cost units one request may use")}),
        422: PROBLEM})
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
            "truncated": result.truncated,
            "truncatedReason": result.truncated_reason or None,
            "classMatches": result.class_matches,
            "runtimeErrors": result.runtime_errors,
            "runtimeErrorSample": result.runtime_error_sample or None,
            "byClusterAndProduct": result.breakdown,
            "estimatedCost": result.estimated_cost,
            "costUnits": result.cost_units,
            "costBudget": REQUEST_COST_BUDGET,
            "elapsedMs": result.elapsed_ms,
        })
