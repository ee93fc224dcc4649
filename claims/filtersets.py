"""Filters for claim lists: ``?phase=Pending&cluster=c1&node=n1&label=team=ml&labelSelector=a=b,c=d``."""
import django_filters
from django.db.models import Q

from claims.models import ClaimEvent, Consumer, Phase, ResourceClaim, ResourceClaimTemplate, UtilisationSnapshot
from draservice.filters import DateTimeFilter


def _label_q(value: str) -> Q:
    q = Q()
    for part in [p.strip() for p in value.split(",") if p.strip()]:
        key, sep, val = part.partition("=")
        key, val = key.strip(), val.strip().lstrip("=")
        # A key transform (not __contains) so that SQLite, the embedded default, can run it too.
        q &= Q(**{f"labels__{key}": val}) if sep else Q(labels__has_key=key)
    return q


class LabelFilterMixin(django_filters.FilterSet):
    label = django_filters.CharFilter(method="filter_labels", help_text="label=value (or just label)")
    labelSelector = django_filters.CharFilter(method="filter_labels", help_text="a=b,c=d (equality only)")

    def filter_labels(self, queryset, name, value):
        return queryset.filter(_label_q(value))


class ResourceClaimFilterSet(LabelFilterMixin):
    phase = django_filters.MultipleChoiceFilter(choices=Phase.choices)
    cluster = django_filters.CharFilter()
    node = django_filters.CharFilter()
    reason = django_filters.CharFilter()
    namespace = django_filters.CharFilter(field_name="namespace__name")

    class Meta:
        model = ResourceClaim
        fields = ["phase", "cluster", "node", "reason", "namespace"]


class ResourceClaimTemplateFilterSet(LabelFilterMixin):
    class Meta:
        model = ResourceClaimTemplate
        fields: list = []


class ConsumerFilterSet(LabelFilterMixin):
    class Meta:
        model = Consumer
        fields: list = []


class ClaimEventFilterSet(django_filters.FilterSet):
    type = django_filters.CharFilter()
    reason = django_filters.CharFilter()

    class Meta:
        model = ClaimEvent
        fields = ["type", "reason"]


class UtilisationFilterSet(django_filters.FilterSet):
    cluster = django_filters.CharFilter()
    driver = django_filters.CharFilter()
    product = django_filters.CharFilter()
    since = DateTimeFilter(field_name="taken_at", lookup_expr="gte")
    until = DateTimeFilter(field_name="taken_at", lookup_expr="lt")

    class Meta:
        model = UtilisationSnapshot
        fields = ["cluster", "driver", "product"]
