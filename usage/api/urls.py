from django.urls import re_path

from usage.api import views

urlpatterns = [
    re_path(r"^usage/?$", views.UsageView.as_view(), name="usage"),
    re_path(r"^usage/history/?$", views.UsageHistoryView.as_view(), name="usage-history"),
    re_path(r"^prices/?$", views.PriceListView.as_view(), name="price-list"),
    re_path(r"^prices/(?P<pk>[0-9]+)/?$", views.PriceDetailView.as_view(), name="price-detail"),
]
