"""Fleet-wide pages: overview, utilisation over time, sharing, fragmentation."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from claims.services.figures import fleet as fleet_q
from draservice.errors import ServiceError
from draservice.pages import is_htmx, page, require
from frontend.queries import fragmentation as frag_q
from frontend.queries import sharing as sharing_q
from frontend.queries import utilisation as util_q
from scheduler.services import defrag, defrag_apply


def _int(value, default: int = 0, lo: int = 0, hi: int = 10**9) -> int:
    try:
        return max(lo, min(hi, int(value)))
    except (TypeError, ValueError):
        return default


@login_required
@require_GET
def overview(request):
    data = fleet_q.fleet_overview()
    # htmx polls the same URL for the live part of the page; it gets only that fragment back.
    template = "frontend/partials/overview_live.html" if is_htmx(request) else "frontend/overview.html"
    return page(request, template, "overview", {"title": "Fleet overview", **data})


@login_required
@require_GET
def utilisation(request):
    cluster = request.GET.get("cluster", "")
    data = util_q.utilisation(request.GET.get("range"), cluster=cluster)
    clusters = [c.name for c in fleet_q.cluster_freshness()]
    return page(request, "frontend/utilisation.html", "utilisation",
                {"title": "Utilisation over time", "cluster": cluster, "clusters": clusters, **data})


@login_required
@require_GET
def sharing(request):
    per_page = 100
    p = _int(request.GET.get("page"), 1, 1)
    namespace, cluster = request.GET.get("namespace", "").strip(), request.GET.get("cluster", "").strip()
    data = sharing_q.shared_devices(namespace=namespace, cluster=cluster, limit=per_page, offset=(p - 1) * per_page)
    return page(request, "frontend/sharing.html", "sharing", {
        "title": "Sharing", **data, "split_gpus": sharing_q.split_gpus(), "namespace": namespace, "cluster": cluster,
        "page_no": p, "has_next": p * per_page < data["total"], "has_prev": p > 1,
        "clusters": [c.name for c in fleet_q.cluster_freshness()],
    })


@login_required
@require_GET
def fragmentation(request):
    advice = defrag.advice()
    return page(request, "frontend/fragmentation.html", "fragmentation",
                {"title": "Fragmentation", **frag_q.fragmentation(), "plans": [p.to_dict() for p in advice.plans],
                 "stranded": advice.stranded, "advice_complete": advice.exhaustive,
                 "can_apply": request.user.is_staff})


@login_required
@require_POST
def apply_plan(request, plan_id):
    # Admins only, as the API's POST /api/v1/defragmentation/plans/{id}/apply (staff = admin on the dashboard).
    require(request.user.is_staff)
    try:
        done = defrag_apply.apply_plan(plan_id, actor=request.user.get_username())
    except ServiceError as exc:
        messages.error(request, f"The plan was not applied: {exc.detail}")
    else:
        releasing = (f"{', '.join(done['releasing'])} keep their devices until the cluster's agent (or an admin) "
                     f"releases them, at the latest {done['releaseDeadline'][:16].replace('T', ' ')} UTC")
        waiting = (f"{done['target']} waits for the freed node, held for it" if done["holdUntil"] else
                   f"the freed node is not held: no claim of the shape {done['target']} is pending")
        messages.success(request, f"Plan {plan_id} applied: {', '.join(done['created'])} allocated on the new "
                                  f"node; {releasing}; {waiting}.")
    return redirect("frontend:fragmentation")
