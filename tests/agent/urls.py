"""The service's API as the agent sees it. The frontend (developed concurrently in this tree) is left out
so that the agent's tests exercise the APIs they talk to and nothing else."""
from django.urls import include, path

urlpatterns = [
    path("api/v1/", include("inventory.api.urls")),
    path("api/v1/", include("claims.api.urls")),
]
