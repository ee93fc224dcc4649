from django.urls import path

from gangs.api import views

NS = "namespaces/<str:namespace>"
GANG = f"{NS}/gangs/<str:name>"

urlpatterns = [
    path("simulate/gang", views.SimulateGangView.as_view(), name="simulate-gang"),
    path("gangs", views.AllGangsView.as_view(), name="gang-all"),
    path(f"{NS}/gangs", views.GangListView.as_view(), name="gang-list"),
    path(GANG, views.GangDetailView.as_view(), name="gang-detail"),
    path(f"{GANG}/release", views.GangReleaseView.as_view(), name="gang-release"),
    path(f"{GANG}/events", views.GangEventsView.as_view(), name="gang-events"),
]
