from django.urls import path
from rest_framework.routers import DefaultRouter

from inventory.api import cel, views

# Paths work with and without a trailing slash (agents and kubectl-style clients differ).
router = DefaultRouter()
router.trailing_slash = "/?"  # the constructor only takes a bool
router.include_root_view = False
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("resourceslices", views.ResourceSliceViewSet, basename="resourceslice")
router.register("pools", views.PoolViewSet, basename="pool")
router.register("poolevents", views.PoolEventViewSet, basename="poolevent")
router.register("devices", views.DeviceViewSet, basename="device")
router.register("deviceclasses", views.DeviceClassViewSet, basename="deviceclass")
router.register("devicetainterules", views.DeviceTaintRuleViewSet, basename="devicetainterule")

urlpatterns = router.urls + [
    path("cel/validate", cel.CELValidateView.as_view(), name="cel-validate"),
    path("cel/match", cel.CELMatchView.as_view(), name="cel-match"),
]
