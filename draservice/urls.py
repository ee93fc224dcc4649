from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from draservice import health, metrics
from draservice.audit_views import AuditEventListView

# Patterns are tried in order, so the claims API (the busiest routes: create, read, release) comes first. No
# other pattern can match one of its paths (they all start with other literals), so the order changes only
# how many patterns a request tries.
urlpatterns = [
    path("api/v1/", include("claims.api.urls")),
    path("api/v1/", include("scheduler.api.urls")),
    path("livez", health.livez, name="livez"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/schema/swagger-ui/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/v1/", include("inventory.api.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("gangs.api.urls")),
    path("gangs/", include("gangs.urls")),
    path("api/v1/", include("queues.api.urls")),
    path("k8s/", include("kube.urls")),
    path("queues/", include("queues.urls")),
    path("api/v1/", include("usage.api.urls")),
    re_path(r"^api/v1/auditevents/?$", AuditEventListView.as_view(), name="auditevent-list"),
    path("usage/", include("usage.urls")),
    path("replays/", include("scheduler.urls")),
    path("", include("frontend.urls")),
]

# Under /api/ Django's own 400/403/404/500 pages are problem+json too (draservice.problems).
handler400 = "draservice.problems.api_handler400"
handler403 = "draservice.problems.api_handler403"
handler404 = "draservice.problems.api_handler404"
handler500 = "draservice.problems.api_handler500"
