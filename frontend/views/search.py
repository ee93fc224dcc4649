"""The header's global search and its results page."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.views.decorators.http import require_GET

from draservice.pages import page
from draservice.permissions import readable_namespaces
from frontend.queries import search as search_q


@login_required
@require_GET
def search(request):
    # The API's own rule decides which namespaces' claims may appear (a namespace-scoped caller sees only its
    # namespaces); a signed-in dashboard user reads every namespace, as on every other dashboard page.
    results = search_q.search(request.GET.get("q", ""), readable_namespaces(request))
    return page(request, "frontend/search.html", "search",
                {"title": f"Search: {results.q}" if results.q else "Search", "r": results, "search_q": results.q,
                 "limit": search_q.LIMIT})
