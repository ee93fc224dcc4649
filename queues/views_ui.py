"""Dashboard page for queues (same rules as the rest of the dashboard: logged-in people look)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.views.decorators.http import require_GET

from draservice.pages import page
from draservice.permissions import access_for
from queues import dashboard


@login_required
@require_GET
def queue_list(request):
    return page(request, "queues/list.html", "queues", {"title": "Queues", "rows": dashboard.queue_rows()})


@login_required
@require_GET
def queue_detail(request, name: str):
    """One queue: its figures from the tree, and (admins: the trail names tokens and people) its policy changes."""
    found = dashboard.queue_page(name, show_history=access_for(request).is_admin)
    if found is None:
        raise Http404("no such queue")
    return page(request, "queues/detail.html", "queues", {"title": f"Queue {name}", "name": name, **found})


@login_required
@require_GET
def reservation_detail(request, name: str):
    """One reservation: its status and object, and (admins) its changes."""
    found = dashboard.reservation_page(name, show_history=access_for(request).is_admin)
    if found is None:
        raise Http404("no such reservation")
    return page(request, "queues/reservation.html", "queues", {"title": f"Reservation {name}", **found})


@login_required
@require_GET
def reservation_timeline(request):
    """The reservations' windows over the next days (``?days=``, 1 to 31, default 7) and their use now."""
    try:
        days = min(31, max(1, int(request.GET.get("days") or 7)))
    except ValueError:
        days = 7
    return page(request, "queues/reservations.html", "queues",
                {"title": "Reservations", **dashboard.reservation_timeline(days)})
