"""Dashboard pages for replays, under /replays/ (the API is in ``scheduler.api.urls``)."""
from django.urls import path

from scheduler import views_ui

app_name = "replays"

urlpatterns = [
    path("", views_ui.replay_list, name="list"),
    path("start/", views_ui.start_replay, name="start"),
    path("<str:name>/", views_ui.replay_detail, name="detail"),
]
