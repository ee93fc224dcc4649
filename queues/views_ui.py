"""Dashboard page for queues (same rules as the rest of the dashboard: logged-in people look)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.views.decorators.http import require_GET

from draservice.pages import page
from queues import dashboard


@login_required
@require_GET
def queue_list(request):
    return page(request, "queues/list.html", "queues", {"title": "Queues", "rows": dashboard.queue_rows()})
