"""Dashboard URLs. Everything needs a logged-in person (Django auth); writes, permissions too (draservice.pages)."""
from django.urls import path

from frontend.views import auth, claims, fleet, inventory, nodes, search

app_name = "frontend"

urlpatterns = [
    # Browsers ask for /favicon.ico on their own, before and without a login.
    path("favicon.ico", auth.favicon, name="favicon"),
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path("", fleet.overview, name="overview"),
    path("utilisation/", fleet.utilisation, name="utilisation"),
    path("sharing/", fleet.sharing, name="sharing"),
    path("fragmentation/", fleet.fragmentation, name="fragmentation"),
    path("fragmentation/plans/<str:plan_id>/apply/", fleet.apply_plan, name="apply-plan"),
    path("clusters/", nodes.cluster_list, name="clusters"),
    path("clusters/<str:cluster>/", nodes.cluster_detail, name="cluster"),
    path("clusters/<str:cluster>/nodes/<str:node>/", nodes.node_detail, name="node"),
    # Pool names may hold slashes (DNS subdomains separated by "/"), hence <path:pool>, and the taint action
    # lives under its own prefix so that no device name can be mistaken for it.
    path("clusters/<str:cluster>/devices/<str:driver>/<path:pool>/<str:device>/", nodes.device_detail, name="device"),
    path("actions/taint/<str:cluster>/<str:driver>/<path:pool>/<str:device>/", nodes.taint_device,
         name="taint-device"),
    # History pages live under their own prefix for the same reason as the taint action.
    path("history/nodes/<str:cluster>/<str:node>/", nodes.node_history, name="node-history"),
    path("history/devices/<str:cluster>/<str:driver>/<path:pool>/<str:device>/", nodes.device_history,
         name="device-history"),
    path("history/gpus/<str:cluster>/<str:driver>/<path:pool>/<str:counter_set>/", nodes.gpu_history,
         name="gpu-history"),
    path("search/", search.search, name="search"),
    path("claims/", claims.claim_list, name="claims"),
    path("claims/<str:namespace>/<str:name>/", claims.claim_detail, name="claim"),
    path("claims/<str:namespace>/<str:name>/release/", claims.release_claim, name="release-claim"),
    path("inventory/slices/", inventory.slice_list, name="slices"),
    path("inventory/slices/<str:cluster>/<str:name>/", inventory.slice_detail, name="slice"),
    path("inventory/pools/", inventory.pool_list, name="pools"),
    path("inventory/deviceclasses/", inventory.deviceclass_list, name="deviceclasses"),
    path("inventory/deviceclasses/<str:name>/", inventory.deviceclass_detail, name="deviceclass"),
    path("inventory/try-selector/", inventory.try_selector, name="try-selector"),
    path("inventory/taintrules/", inventory.taintrule_list, name="taintrules"),
]
