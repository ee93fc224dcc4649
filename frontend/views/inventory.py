"""Inventory pages: ResourceSlices, pools, DeviceClasses (with "try this selector"), DeviceTaintRules."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.views.decorators.http import require_GET, require_http_methods

from draservice.pages import is_htmx, page
from draservice.permissions import access_for
from frontend.queries import inventory as inv_q
from inventory.services import selectors as sel_q


@login_required
@require_GET
def slice_list(request):
    data = inv_q.slice_list(request.GET)
    return page(request, "frontend/inventory/slices.html", "slices", {"title": "ResourceSlices", **data})


@login_required
@require_GET
def slice_detail(request, cluster, name):
    data = inv_q.slice_detail(cluster, name)
    if data is None:
        raise Http404("no such slice")
    return page(request, "frontend/inventory/slice.html", "slices", {"title": name, **data})


@login_required
@require_GET
def pool_list(request):
    data = inv_q.pool_list(request.GET)
    return page(request, "frontend/inventory/pools.html", "pools", {"title": "Pools", **data})


@login_required
@require_GET
def deviceclass_list(request):
    return page(request, "frontend/inventory/deviceclasses.html", "deviceclasses",
                {"title": "DeviceClasses", **inv_q.deviceclass_list()})


@login_required
@require_GET
def deviceclass_detail(request, name):
    data = inv_q.deviceclass_detail(name, request.GET.get("cluster", ""), show_history=access_for(request).is_admin)
    if data is None:
        raise Http404("no such DeviceClass")
    return page(request, "frontend/inventory/deviceclass.html", "deviceclasses", {"title": name, **data})


# Evaluating a selector is read-only, so read-only users may try selectors too. POST (with CSRF) because the
# expression can be long; GET works for a shareable link.
@login_required
@require_http_methods(["GET", "POST"])
def try_selector(request):
    params = request.POST if request.method == "POST" else request.GET
    expression = params.get("expression", "")
    device_class = params.get("class", "")
    result = sel_q.try_selector(expression, device_class=device_class) if expression.strip() else None
    # htmx swaps just the answer into the class page; a link opened directly gets a whole page.
    template = "frontend/partials/selector_result.html" if is_htmx(request) else "frontend/inventory/try_selector.html"
    return page(request, template, "deviceclasses", {"title": "Try a selector", "result": result,
                                                     "expression": expression, "device_class": device_class})


@login_required
@require_GET
def taintrule_list(request):
    return page(request, "frontend/inventory/taintrules.html", "taintrules",
                {"title": "DeviceTaintRules", **inv_q.taintrule_list()})
