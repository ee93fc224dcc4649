"""Query filters of the inventory API (django-filter), NetBox style: one FilterSet per model.

Repeatable filters take several values (``?cluster=a&cluster=b`` or ``?cluster=a,b``). ``?attribute=`` and
``?label=`` take ``name=value`` and match on equality; attribute names may be fully qualified
(``gpu.nvidia.com/productName``) or bare (``productName``, meaning the device driver's own domain).
"""
from __future__ import annotations

from functools import reduce
from operator import or_

import django_filters as filters
from django.db import connection
from django.db.models import Q
from rest_framework.exceptions import ValidationError

from inventory import hooks
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node, Pool, PoolEvent, ResourceSlice
from inventory.services.clusters import fresh_clusters_q
from inventory.services.taints import tainted_condition


class MultiValueFilter(filters.BaseInFilter, filters.CharFilter):
    """``?x=a,b`` and ``?x=a&x=b`` both work."""

    def filter(self, qs, value):
        return super().filter(qs, value) if value else qs


def _split_pair(raw: str, param: str) -> tuple[str, str]:
    name, sep, value = raw.partition("=")
    if not sep or not name:
        raise ValidationError({param: [f"expected name=value, got {raw!r}"]})
    return name.strip(), value


def _json_equals(field: str, key: str, value: str) -> Q:
    """``field[key] == value`` (or value in a list there): GIN containment on PostgreSQL, key lookup elsewhere."""
    if connection.vendor == "postgresql":
        return Q(**{f"{field}__contains": {key: value}}) | Q(**{f"{field}__contains": {key: [value]}})
    return Q(**{f"{field}__{key}": value})


class PairFilter(filters.CharFilter):
    """Base for ``name=value`` filters; repeated parameters are ANDed."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("method", None)
        super().__init__(*args, **kwargs)

    def filter(self, qs, value):  # value is ignored: we read every occurrence from the request
        request = getattr(self.parent, "request", None)
        raw_values = (request.query_params.getlist(self.field_name) if request is not None
                      else ([value] if value else []))
        for raw in raw_values:
            if raw:
                qs = qs.filter(self.condition(qs, *_split_pair(raw, self.field_name)))
        return qs.distinct() if raw_values and self.distinct else qs


class AttributeFilter(PairFilter):
    def condition(self, qs, name, value):
        if "/" in name:
            return _json_equals("attribute_index", name, value)
        # A bare name belongs to each device's own driver domain: try every driver present.
        drivers = qs.order_by().values_list("driver", flat=True).distinct()
        condition = Q(pk__in=[])
        for driver in drivers:
            condition |= Q(driver=driver) & _json_equals("attribute_index", f"{driver}/{name}", value)
        return condition


class LabelFilter(PairFilter):
    def __init__(self, *args, label_field="labels", **kwargs):
        self.label_field = label_field
        super().__init__(*args, **kwargs)

    def condition(self, qs, name, value):
        return _json_equals(self.label_field, name, value)


class AllocationStateFilter(filters.CharFilter):
    """``?state=allocated`` (or ``free``, ``shared``, ``?state=a,b``, repeated): the states the claims app
    reports through ``inventory.hooks``; an unknown state is a 400 naming the supported ones."""

    def filter(self, qs, value):
        request = getattr(self.parent, "request", None)
        raw = request.query_params.getlist(self.field_name) if request is not None else [value or ""]
        wanted = [v.strip() for item in raw for v in item.split(",") if v.strip()]
        if not wanted:
            return qs
        supported = hooks.allocation_state_names()
        unknown = [v for v in wanted if v not in supported]
        if unknown:
            raise ValidationError({self.field_name: [
                f"Unsupported value: {v!r}: supported values: " + ", ".join(f'"{s}"' for s in supported)
                for v in unknown]})
        conditions = [hooks.allocation_state_q(state) for state in dict.fromkeys(wanted)]
        if any(not c for c in conditions):
            return qs  # an empty Q selects every device ("free" when no app holds any)
        return qs.filter(reduce(or_, conditions))


class ClusterFilterSet(filters.FilterSet):
    name = MultiValueFilter(field_name="name")
    label = LabelFilter(field_name="label", help_text="name=value; repeat to AND (e.g. region=eu-west)")
    stale = filters.BooleanFilter(method="filter_stale")

    class Meta:
        model = Cluster
        fields = ["name", "label", "stale"]

    def filter_stale(self, qs, name, value):
        return qs.exclude(fresh_clusters_q()) if value else qs.filter(fresh_clusters_q())


class NodeFilterSet(filters.FilterSet):
    cluster = MultiValueFilter(field_name="cluster__name")
    name = MultiValueFilter(field_name="name")
    label = LabelFilter(field_name="label", help_text="name=value; repeat to AND (e.g. topology.kubernetes.io/zone=a)")

    class Meta:
        model = Node
        fields = ["cluster", "name", "label"]


class ResourceSliceFilterSet(filters.FilterSet):
    cluster = MultiValueFilter(field_name="cluster__name")
    name = MultiValueFilter(field_name="name")
    driver = MultiValueFilter(field_name="driver")
    pool = MultiValueFilter(field_name="pool_name")
    node = MultiValueFilter(field_name="node_name")

    class Meta:
        model = ResourceSlice
        fields = ["cluster", "name", "driver", "pool", "node"]


class PoolFilterSet(filters.FilterSet):
    cluster = MultiValueFilter(field_name="cluster__name")
    driver = MultiValueFilter(field_name="driver")
    name = MultiValueFilter(field_name="name")
    state = filters.MultipleChoiceFilter(choices=Pool.STATES)

    class Meta:
        model = Pool
        fields = ["cluster", "driver", "name", "state"]


class PoolEventFilterSet(filters.FilterSet):
    cluster = MultiValueFilter(field_name="cluster__name")
    driver = MultiValueFilter(field_name="driver")
    pool = MultiValueFilter(field_name="pool")
    type = MultiValueFilter(field_name="type")

    class Meta:
        model = PoolEvent
        fields = ["cluster", "driver", "pool", "type"]


class DeviceFilterSet(filters.FilterSet):
    cluster = MultiValueFilter(field_name="cluster__name")
    node = MultiValueFilter(field_name="node_name")
    driver = MultiValueFilter(field_name="driver")
    pool = MultiValueFilter(field_name="pool_name")
    name = MultiValueFilter(field_name="name")
    resource_slice = MultiValueFilter(field_name="resource_slice__name")
    attribute = AttributeFilter(field_name="attribute",
                                help_text="name=value; repeat to AND, "
                                          "e.g. gpu.nvidia.com/productName=NVIDIA H100 80GB HBM3")
    node_label = LabelFilter(field_name="node_label", label_field="node__labels",
                             help_text="name=value on the device's node labels")
    tainted = filters.BooleanFilter(method="filter_tainted",
                                    help_text="devices with a taint of their own or from a DeviceTaintRule")
    stale = filters.BooleanFilter(method="filter_stale", help_text="devices of stale clusters")
    state = AllocationStateFilter(field_name="state",
                                  help_text="allocation state: free, allocated, shared (repeat or comma-separate)")

    class Meta:
        model = Device
        fields = ["cluster", "node", "driver", "pool", "name", "resource_slice", "attribute", "node_label",
                  "tainted", "stale", "state"]

    def filter_tainted(self, qs, name, value):
        return qs.filter(tainted_condition()) if value else qs.exclude(tainted_condition())

    def filter_stale(self, qs, name, value):
        fresh = Cluster.objects.filter(fresh_clusters_q()).values("pk")
        return qs.exclude(cluster__in=fresh) if value else qs.filter(cluster__in=fresh)


class _ScopedFilterSet(filters.FilterSet):
    cluster = MultiValueFilter(field_name="cluster__name")
    name = MultiValueFilter(field_name="name")
    scope = filters.ChoiceFilter(choices=[("fleet", "fleet"), ("cluster", "cluster")], method="filter_scope")

    def filter_scope(self, qs, name, value):
        return qs.filter(cluster__isnull=(value == "fleet"))


class DeviceClassFilterSet(_ScopedFilterSet):
    class Meta:
        model = DeviceClass
        fields = ["cluster", "name", "scope"]


class DeviceTaintRuleFilterSet(_ScopedFilterSet):
    driver = MultiValueFilter(field_name="driver")
    pool = MultiValueFilter(field_name="pool_name")
    device = MultiValueFilter(field_name="device_name")
    effect = MultiValueFilter(field_name="effect")

    class Meta:
        model = DeviceTaintRule
        fields = ["cluster", "name", "scope", "driver", "pool", "device", "effect"]
