"""Filters for gang lists: ``?phase=Pending`` (repeatable); a phase that does not exist is a 400."""
import django_filters

from gangs.models import Gang, GangPhase


class GangFilterSet(django_filters.FilterSet):
    phase = django_filters.MultipleChoiceFilter(choices=GangPhase.choices)

    class Meta:
        model = Gang
        fields = ["phase"]
