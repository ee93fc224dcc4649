"""Filter backends of every list: query parameters with Kubernetes' rules.

* A filter value the list cannot use (``?phase=Bogus``, ``?since=yesterday``) is a 400 naming the parameter,
  worded like upstream's field errors (``Unsupported value: "Bogus": supported values: ...``); it was a
  "Invalid object" titled as if the body were wrong.
* ``fieldSelector`` (``metadata.name=x``, ``metadata.namespace!=y``, comma-separated terms, ANDed) works on
  ``metadata.name`` and ``metadata.namespace`` where the objects have them; any other field is a 400 that
  names the supported ones (upstream: ``field label not supported: ...``). It was silently ignored.
"""
from __future__ import annotations

import datetime as dt
import re

import django_filters
from django import forms
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db.models import Q
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import filters, status
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend

from draservice.problems import FieldError, flatten_errors


def bad_parameter(errors: list[tuple[str, str]]) -> FieldError:
    return FieldError(errors, status_code=status.HTTP_400_BAD_REQUEST, title="Invalid query parameter")


class FilterBackend(DjangoFilterBackend):
    """django-filter, with its form errors (and the ValidationErrors of filter methods) as 400s."""

    def filter_queryset(self, request, queryset, view):
        filterset = self.get_filterset(request, queryset, view)
        if filterset is None:
            return queryset
        if not filterset.is_valid():
            raise bad_parameter(_form_errors(filterset, request))
        try:
            return filterset.qs
        except ValidationError as exc:  # raised by filter methods parsing their own syntax
            raise bad_parameter([(e["field"], e["reason"]) for e in flatten_errors(exc.detail)]) from None


def _form_errors(filterset, request) -> list[tuple[str, str]]:
    errors = []
    for name, error_list in filterset.form.errors.as_data().items():
        values = request.query_params.getlist(name) or [""]
        for error in error_list:
            if error.code == "invalid_choice":
                choices = [str(value) for value, _ in filterset.form.fields[name].choices if value != ""]
                given = (error.params or {}).get("value", values[0])
                errors.append((name, f'Unsupported value: "{given}": supported values: '
                                     + ", ".join(f'"{c}"' for c in choices)))
            else:
                message = error.message % (error.params or {})
                errors.append((name, f"Invalid value: {', '.join(values)!r}: {message}"))
    return errors


class _UTCDateTimeField(IsoDateTimeField):
    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            # PostgreSQL takes UTC offsets up to 15:59 only; Python (and RFC 3339) up to 23:59, which the
            # database refused with a 500. The instant in UTC is the same instant.
            return value.astimezone(dt.UTC)
        except OverflowError:
            raise forms.ValidationError("must be a date-time between years 1 and 9999 in UTC",
                                        code="invalid") from None


class DateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 / RFC 3339 date-time, compared in UTC."""

    field_class = _UTCDateTimeField


# ------------------------------------------------------------------------------------------- fieldSelector

_TERM = re.compile(r"^\s*([A-Za-z0-9_.\-/]+)\s*(==|!=|=)\s*(.*?)\s*$")
# metadata.<field> -> the model field it is stored in, where a model has it.
_FIELDS = {"metadata.name": ("name",), "metadata.namespace": ("namespace__name", "namespace")}


def supported_field_selectors(model) -> dict[str, str]:
    """``{selector field: ORM lookup}`` for a model: metadata.name and metadata.namespace where it has them."""
    out = {}
    for selector, candidates in _FIELDS.items():
        for lookup in candidates:
            try:
                field = model._meta.get_field(lookup.split("__")[0])
            except FieldDoesNotExist:
                continue
            if "__" in lookup and not field.is_relation:
                continue
            if "__" not in lookup and field.is_relation:
                continue
            out[selector] = lookup
            break
    return out


def parse_field_selector(raw: str, supported: dict[str, str], param: str = "fieldSelector") -> Q:
    condition = Q()
    for term in [t for t in raw.split(",") if t.strip()]:
        match = _TERM.match(term)
        if not match:
            raise bad_parameter([(param, f"invalid selector: {raw!r}; can't understand {term!r}")])
        field, operator, value = match.groups()
        if field not in supported:
            names = ", ".join(sorted(supported)) or "none on this list"
            raise bad_parameter([(param, f"field label not supported: {field} (supported: {names})")])
        q = Q(**{supported[field]: value})
        condition &= ~q if operator == "!=" else q
    return condition


class FieldSelectorFilter(BaseFilterBackend):
    """``?fieldSelector=`` on list endpoints (a detail GET ignores it, as upstream does)."""

    param = "fieldSelector"

    def filter_queryset(self, request, queryset, view):
        raw = request.query_params.get(self.param)
        if raw is None or getattr(view, "action", "list") not in ("list", None):
            return queryset
        return queryset.filter(parse_field_selector(raw, supported_field_selectors(queryset.model), self.param))

    def get_schema_operation_parameters(self, view):
        return [{"name": self.param, "required": False, "in": "query", "schema": {"type": "string"},
                 "description": "Kubernetes field selector: metadata.name and metadata.namespace (where the "
                                "objects have one) with =, == or !=, comma-separated terms ANDed."}]


class OrderingFilter(filters.OrderingFilter):
    """``?ordering=`` where a view declares what it may be ordered by (``ordering_fields``, or its serializer's
    fields); elsewhere the parameter is ignored, as DRF ignores fields it does not know. (DRF's own filter
    raises ImproperlyConfigured, a 500, on views that declare neither, such as the Kubernetes-shaped lists,
    which render without a serializer class.)"""

    def get_default_valid_fields(self, queryset, view, context=None):
        if getattr(view, "serializer_class", None) is None and not hasattr(view, "get_serializer_class"):
            return []
        try:
            return super().get_default_valid_fields(queryset, view, context or {})
        except ImproperlyConfigured:
            return []
