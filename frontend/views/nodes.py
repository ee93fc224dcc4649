"""Cluster -> node -> device drill-down, and the "taint this device" action."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from claims.services.figures import fleet as fleet_q
from claims.services.figures.accelerators import STATE_LABELS
from draservice.pages import can_taint, page, require
from frontend import actions
from frontend.queries import history as history_q
from frontend.queries import inventory as inv_q
from frontend.queries import nodes as nodes_q
from inventory.models import Cluster, Device, Node, Pool


@login_required
@require_GET
def cluster_list(request):
    data = fleet_q.fleet_overview()
    return page(request, "frontend/fleet/clusters.html", "clusters", {"title": "Clusters", **data})


@login_required
@require_GET
def cluster_detail(request, cluster):
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    search = request.GET.get("q", "").strip()
    try:
        p = max(1, int(request.GET.get("page", 1)))
    except ValueError:
        p = 1
    per_page = 120
    data = fleet_q.cluster_detail(c, search=search, offset=(p - 1) * per_page, limit=per_page)
    pools = Pool.objects.filter(cluster=c).exclude(state=Pool.COMPLETE).order_by("driver", "name")[:50]
    return page(request, "frontend/fleet/cluster.html", "clusters", {
        "title": c.name, "cluster": c, "stale": c.is_stale(), **data,
        "devices_published": fleet_q.published_devices().get(c.id, 0), "q": search, "page_no": p,
        "has_next": p * per_page < data["node_total"], "has_prev": p > 1,
        "bad_pools": pools, "pool_events": inv_q.recent_pool_events(c.name, limit=10),
    })


@login_required
@require_GET
def node_detail(request, cluster, node):
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    node_obj = Node.objects.filter(cluster=c, name=node).first()
    lay = nodes_q.node_detail(c, node)
    if node_obj is None and not (lay.whole or lay.counter_sets or lay.parents):
        raise Http404("no such node")
    gpus = fleet_q.node_tally(c, node)
    return page(request, "frontend/fleet/node.html", "clusters", {
        "title": f"{node} · {c.name}", "cluster": c, "node_name": node, "node": node_obj, "layout": lay,
        "stale": c.is_stale(), "gpus": gpus, "helpers": nodes_q.helper_devices(c, node),
        "gpu_states": [((s, STATE_LABELS[s]), n) for s, n in gpus.states.items()],
    })


@login_required
@require_GET
def device_detail(request, cluster, driver, pool, device):
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    view, counter_set = nodes_q.device_detail(c, driver, pool, device)
    if view is None:
        raise Http404("no such device")
    caps = nodes_q.capacity_views(view) if view.device.allow_multiple_allocations else []
    return page(request, "frontend/fleet/device.html", "clusters", {
        "title": f"{device} · {view.device.node_name or c.name}", "cluster": c, "d": view, "counter_set": counter_set,
        "capacities": caps, "taint_scope": actions.taint_scope(driver, pool, device),
    })


@login_required
@require_POST
def taint_device(request, cluster, driver, pool, device):
    require(can_taint(request.user))
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    effect = request.POST.get("effect", "NoSchedule")
    reason = request.POST.get("reason", "").strip()
    try:
        rule = actions.taint_device(c, driver, pool, device, effect=effect, reason=reason, user=request.user)
    except actions.ActionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Tainted {device} ({effect}) with DeviceTaintRule {rule.name}.")
    return redirect("frontend:device", cluster=cluster, driver=driver, pool=pool, device=device)


@login_required
@require_GET
def node_history(request, cluster, node):
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    data = history_q.history(c.name, node, request.GET.get("range"))
    return page(request, "frontend/fleet/history.html", "clusters", {
        "title": f"History · {node}", "cluster": c, "node_name": node, "device": None, **data})


@login_required
@require_GET
def device_history(request, cluster, driver, pool, device):
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    d = Device.objects.filter(cluster=c, driver=driver, pool_name=pool, name=device).only("node_name").first()
    if d is None:
        raise Http404("no such device")
    data = history_q.history(c.name, d.node_name, request.GET.get("range"), devices={(driver, pool, device)})
    return page(request, "frontend/fleet/history.html", "clusters", {
        "title": f"History · {device}", "cluster": c, "node_name": d.node_name,
        "device": {"driver": driver, "pool": pool, "name": device}, **data})


@login_required
@require_GET
def gpu_history(request, cluster, driver, pool, counter_set):
    """A partitionable GPU: every partition placement that draws on its counter set, together."""
    c = get_object_or_404(Cluster.objects.all(), name=cluster)
    # A pool is one node's devices (a few hundred at most): the counter set is matched here rather than with a
    # JSON containment query, which SQLite (the embedded default) lacks.
    members = [d for d in Device.objects.filter(cluster=c, driver=driver, pool_name=pool)
               .only("name", "node_name", "consumes_counters")
               if any(x.get("counterSet") == counter_set for x in d.consumes_counters or ())]
    if not members:
        raise Http404("no such GPU")
    data = history_q.history(c.name, members[0].node_name, request.GET.get("range"),
                             devices={(driver, pool, d.name) for d in members})
    return page(request, "frontend/fleet/history.html", "clusters", {
        "title": f"History · {counter_set}", "cluster": c, "node_name": members[0].node_name,
        "gpu": {"driver": driver, "pool": pool, "name": counter_set, "placements": len(members)}, **data})
