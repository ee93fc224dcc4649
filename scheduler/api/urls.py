"""The scheduler's REST doors (above it, so that claims, queues and gangs never import the scheduler)."""
from django.urls import path

from scheduler.api.defrag import ApplyPlanView, DefragmentationView

urlpatterns = [
    path("defragmentation", DefragmentationView.as_view(), name="defragmentation"),
    path("defragmentation/plans/<str:plan_id>/apply", ApplyPlanView.as_view(), name="defragmentation-apply"),
]
