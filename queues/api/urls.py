from django.urls import re_path

from queues.api import reservations, views

urlpatterns = [
    re_path(r"^queues/?$", views.QueueListView.as_view(), name="queue-list"),
    re_path(r"^queues/(?P<name>[^/]+)/?$", views.QueueDetailView.as_view(), name="queue-detail"),
    re_path(r"^queues/(?P<name>[^/]+)/deliveries/?$", views.QueueDeliveryListView.as_view(), name="queue-deliveries"),
    re_path(r"^queues/(?P<name>[^/]+)/webhook-events/?$", views.QueueWebhookEventListView.as_view(),
            name="queue-webhook-events"),
    re_path(r"^reservations/?$", reservations.ReservationListView.as_view(), name="reservation-list"),
    re_path(r"^reservations/(?P<name>[^/]+)/?$", reservations.ReservationDetailView.as_view(),
            name="reservation-detail"),
]
