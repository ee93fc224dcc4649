"""The inventory's slice of the root URLconf (same paths), so these tests do not depend on other apps' views."""
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/", include("inventory.api.urls")),
]
