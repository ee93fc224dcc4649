"""The scheduler's REST doors (above it, so that claims, queues and gangs never import the scheduler)."""
from django.urls import path

from scheduler.api.defrag import ApplyPlanView, DefragmentationView
from scheduler.api.replays import ReplayDetailView, ReplayListView

urlpatterns = [
    path("defragmentation", DefragmentationView.as_view(), name="defragmentation"),
    path("defragmentation/plans/<str:plan_id>/apply", ApplyPlanView.as_view(), name="defragmentation-apply"),
    path("replays", ReplayListView.as_view(), name="replay-list"),
    path("replays/<str:name>", ReplayDetailView.as_view(), name="replay-detail"),
]
