"""ResourceClaims: the filtered list, one claim in full, and the "release" action for operators."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from draservice.pages import can_release, is_htmx, page, require
from frontend import actions, explain
from frontend.queries import claims as claims_q


@login_required
@require_GET
def claim_list(request):
    filters = claims_q.ClaimFilters.from_request(request.GET)
    data = claims_q.claim_list(filters, request.GET.get("page", 1))
    template = "frontend/claims/list_rows.html" if is_htmx(request) else "frontend/claims/list.html"
    return page(request, template, "claims", {"title": "ResourceClaims", "f": filters, **data,
                                             **claims_q.filter_choices()})


@login_required
@require_GET
def claim_detail(request, namespace, name):
    data = claims_q.claim_detail(namespace, name)
    if data is None:
        raise Http404("no such claim")
    claim = data["claim"]
    explanation = explain.explain(claim) if claim.phase in ("Pending", "Failed") else None
    return page(request, "frontend/claims/detail.html", "claims",
                {"title": f"{namespace}/{name}", **data, "explanation": explanation})


@login_required
@require_POST
def release_claim(request, namespace, name):
    require(can_release(request.user))
    try:
        actions.release_claim(namespace, name, user=request.user)
    except actions.ActionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Released {namespace}/{name}: its devices are free again.")
    return redirect("frontend:claim", namespace=namespace, name=name)
