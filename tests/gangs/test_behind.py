"""A gang left behind an older one that another worker has in hand is decided once that one is: two passes
could each leave it behind the other's gang and both end, with nothing asking for a pass again (a racing-workers
run ended with the youngest gang never tried)."""
from __future__ import annotations

import pytest

from claims.services import taking
from gangs import dispatch as gang_dispatch
from gangs.models import Gang
from gangs.services import gangs as gang_services
from scheduler import tasks
from scheduler.services import gang_placement
from tests.gangs import fleet
from tests.gangs.conftest import NS

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("decided_meanwhile", [True, False])
def test_a_pass_asks_again_for_a_gang_it_left_behind_once_nothing_is_ahead(rack_fleet, monkeypatch,
                                                                            decided_meanwhile):
    for name in ("older", "younger"):  # 20 x 8 GPUs: neither ever fits, both stay pending
        gang_services.create_gang(NS, fleet.gang_body(name, 20, required=None, preferred=None))
    Gang.objects.update(attempted_version=None)  # both to be decided again
    older, younger = Gang.objects.order_by("id")
    Gang.objects.filter(id=older.id).update(**taking.taken_mark())  # another worker has it in hand
    real = gang_placement.place_next
    seen = []

    def place_next(**kw):
        attempt = real(**kw)
        seen.append((attempt.gang_id, attempt.result))
        if attempt.result == "behind" and decided_meanwhile:  # the other worker decides the older one now
            Gang.objects.filter(id=older.id).update(attempted_version=taking.fleet_version(), taken_until=None)
        return attempt

    asked = []
    monkeypatch.setattr(gang_placement, "place_next", place_next)
    monkeypatch.setattr(gang_dispatch, "request_placement", lambda *a: asked.append(a))
    tasks.place_gangs()
    assert seen[0] == (younger.id, "behind")
    # Decided meanwhile: the younger is free to go and a pass is asked for. Still in hand: the worker deciding
    # the older one goes on to it (or asks), so this pass asks for nothing.
    assert asked == ([()] if decided_meanwhile else [])
