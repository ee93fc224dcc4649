"""Dashboard pages for queues, under /queues/ (the API is in ``queues.api.urls``)."""
from django.urls import path

from queues import views_ui

app_name = "queues"

urlpatterns = [
    path("", views_ui.queue_list, name="list"),
    path("reservations/", views_ui.reservation_timeline, name="reservations"),
    path("reservations/<str:name>/", views_ui.reservation_detail, name="reservation"),
    path("<str:name>/", views_ui.queue_detail, name="detail"),
]
