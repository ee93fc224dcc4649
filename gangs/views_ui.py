"""Dashboard pages for gangs: the list, and one gang's placement drawn over the cluster's topology.

Same rules as the rest of the dashboard (``draservice.pages``): logged-in people look; operators may
release a gang.
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from draservice.pages import can_release, page, require
from gangs import dashboard
from gangs.models import Gang
from gangs.services import gangs as gang_services


@login_required
@require_GET
def gang_list(request):
    data = dashboard.gang_list(request.GET.get("namespace", ""), request.GET.get("phase", ""))
    return page(request, "gangs/list.html", "gangs", {"title": "Gangs", **data})


@login_required
@require_GET
def gang_detail(request, namespace, name):
    data = dashboard.gang_detail(namespace, name)
    if data is None:
        raise Http404("no such gang")
    return page(request, "gangs/detail.html", "gangs", {"title": f"{namespace}/{name}", **data})


@login_required
@require_POST
def release_gang(request, namespace, name):
    require(can_release(request.user))
    gang = Gang.objects.filter(namespace__name=namespace, name=name).first()
    if gang is None:
        raise Http404("no such gang")
    gang_services.release_gang(gang.pk)
    messages.success(request, f"Released {namespace}/{name}: every device it held is free again.")
    return redirect("gangs:detail", namespace=namespace, name=name)
