"""Dashboard page for usage (same rules as the rest of the dashboard: logged-in people look)."""
from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.utils import timezone
from django.views.decorators.http import require_GET

from draservice.pages import page
from draservice.permissions import access_for
from usage import dashboard


@login_required
@require_GET
def usage_page(request):
    data = dashboard.page_data(request.GET.get("range", ""), request.GET.get("group", ""), timezone.now())
    csv_url = "/api/v1/usage?" + urlencode({"groupBy": f"{data['group']},product", "since": data["since"],
                                            "until": data["until"], "format": "csv"})
    return page(request, "usage/usage.html", "usage", {"title": "Usage", "csv_url": csv_url, **data,
                                                       **dashboard.price_data(access_for(request).is_admin)})
