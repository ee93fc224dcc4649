from django.urls import path

from claims.api import fastpost, views
from claims.api.convert import ConvertView
from claims.api.quota import ObjectQuotaView
from claims.api.simulate import SimulateView

NS = "namespaces/<str:namespace>"
CLAIM = f"{NS}/resourceclaims/<str:name>"

# The hot routes first (tried in order; none of the others can match their paths). "batch" before CLAIM.
urlpatterns = [
    path(f"{NS}/resourceclaims", fastpost.claim_list_view(), name="resourceclaim-list"),  # DRF's but for most POSTs
    # POST creates a batch; GET/PUT/PATCH/DELETE act on a claim that happens to be named "batch".
    path(f"{NS}/resourceclaims/batch", views.ClaimBatchView.as_view(), {"name": "batch"},
         name="resourceclaim-batch"),
    path(CLAIM, views.ClaimDetailView.as_view(), name="resourceclaim-detail"),
    path(f"{CLAIM}/release", views.ClaimReleaseView.as_view(), name="resourceclaim-release"),
    path("simulate", SimulateView.as_view(), name="simulate"),
    path("convert", ConvertView.as_view(), name="convert"),
    path("namespaces", views.NamespaceListView.as_view(), name="namespace-list"),
    path("resourceclaims", views.AllClaimsView.as_view(), name="resourceclaim-all"),
    path("utilisation", views.UtilisationView.as_view(), name="utilisation-list"),
    path(f"{CLAIM}/release-confirm", views.ClaimReleaseConfirmView.as_view(), name="resourceclaim-release-confirm"),
    path(f"{CLAIM}/renew", views.ClaimRenewView.as_view(), name="resourceclaim-renew"),
    path(f"{CLAIM}/explain", views.ClaimExplainView.as_view(), name="resourceclaim-explain"),
    path(f"{CLAIM}/events", views.ClaimEventsView.as_view(), name="resourceclaim-events"),
    path(f"{NS}/resourceclaimtemplates", views.TemplateListView.as_view(), name="resourceclaimtemplate-list"),
    path(f"{NS}/resourceclaimtemplates/<str:name>", views.TemplateDetailView.as_view(),
         name="resourceclaimtemplate-detail"),
    path(f"{NS}/consumers", views.ConsumerListView.as_view(), name="consumer-list"),
    path(f"{NS}/consumers/<str:name>", views.ConsumerDetailView.as_view(), name="consumer-detail"),
    path(f"{NS}/objectquota", ObjectQuotaView.as_view(), name="objectquota"),
]
