"""Dashboard pages for gangs, under /gangs/ (the API is in ``gangs.api.urls``)."""
from django.urls import path

from gangs import views_ui

app_name = "gangs"

urlpatterns = [
    path("", views_ui.gang_list, name="list"),
    path("<str:namespace>/<str:name>/", views_ui.gang_detail, name="detail"),
    path("<str:namespace>/<str:name>/release/", views_ui.release_gang, name="release"),
]
