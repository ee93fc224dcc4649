"""Dashboard pages for replays, under /replays/ (the API is ``scheduler.api.replays``): the same rule as the API
(``replays.may_read``: admins look; ``replays.may_start``: writing admins start one) and the same service."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from draservice import audit
from draservice.errors import NotFound, ServiceError
from draservice.pages import page, require
from draservice.permissions import access_for
from draservice.problems import status_of
from scheduler import dashboard
from scheduler.services import replays


def _list(request, form: dashboard.ReplayForm, status: int = 200):
    return page(request, "scheduler/replays.html", "replays",
                {"title": "Replays", "form": form, "can_start": replays.may_start(access_for(request)),
                 **dashboard.replay_list(request.GET.get("page"))}, status=status)


@login_required
@require_GET
def replay_list(request):
    require(replays.may_read(access_for(request)))
    return _list(request, dashboard.ReplayForm())


@login_required
@require_POST
def start_replay(request):
    """The form's "what if": the API's POST, through the same service; a refusal shows the form again, with the
    service's status (422 naming the fields, 409 when too many replays wait)."""
    require(replays.may_start(access_for(request)))
    form = dashboard.ReplayForm(request.POST)
    try:
        replay = replays.create(form.body(), audit.actor()[0])
    except ServiceError as exc:
        return _list(request, form.refused(exc), status=status_of(exc))
    messages.success(request, f"Replay {replay.uid} asked for.")
    return redirect("replays:detail", name=str(replay.uid))


@login_required
@require_GET
def replay_detail(request, name: str):
    require(replays.may_read(access_for(request)))
    try:
        data = dashboard.replay_page(name)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    return page(request, "scheduler/replay.html", "replays", {"title": f"Replay {name}", **data})
