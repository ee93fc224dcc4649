"""Dashboard pages for usage, under /usage/ (the API is in ``usage.api.urls``)."""
from django.urls import path

from usage import views_ui

app_name = "usage"

urlpatterns = [
    path("", views_ui.usage_page, name="page"),
]
