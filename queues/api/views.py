"""Queues API: fleet-wide ``draservice.io/v1alpha1`` Queue objects. Everyone reads; admins write.

Thin views: check access (``IsAdminOrReadOnly``), parse (JSON or YAML), call ``queues.services.queues``,
render with the ETag (``resourceVersion``); ``If-Match`` is compared by the service under its row lock.
"""
from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from draservice import deliveries
from draservice.etag import IF_MATCH_PARAMETER, etag_for, if_match, not_modified
from draservice.models import APIToken, WebhookDelivery, WebhookEvent
from draservice.pagination import KubeListPagination
from draservice.parsers import JSONParser, MergePatchParser
from draservice.permissions import IsAdminOrReadOnly, access_for
from draservice.yaml import YAMLParser
from queues.models import API_VERSION, Queue
from queues.services import queues as queue_services
from queues.services import status as queue_status
from queues.services import webhooks as queue_webhooks

FORCE = OpenApiParameter("force", OpenApiTypes.BOOL, description="delete a queue that holds claims: they move "
                                                                  "to the default queue")


class QueueBase(APIView):
    permission_classes = [IsAdminOrReadOnly]
    # JSON merge patch as its own media type too (what kubectl and most clients send for a PATCH).
    parser_classes = [JSONParser, YAMLParser, MergePatchParser]

    def handle_exception(self, exc):
        if isinstance(exc, ObjectDoesNotExist):
            exc = exceptions.NotFound("queue not found")
        return super().handle_exception(exc)

    def render(self, queue: Queue, code: int = 200, written: bool = False) -> Response:
        body = queue_services.rendered(queue)
        body["status"] = queue_status.queue_status(queue)
        response = Response(body, status=code)
        response["ETag"] = etag_for(queue.resource_version)
        if written:
            warnings = queue_services.class_warnings(queue)
            if warnings:  # RFC 7234 Warning, as kube-apiserver sends them (kubectl prints them)
                response["Warning"] = ", ".join(f'299 - "{w}"' for w in warnings)
        return response


class QueueListView(QueueBase):
    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="List Queues (the tree, with usage)")
    def get(self, request):
        paginator = KubeListPagination()  # the API's one list pagination (limit, continue, resourceVersion)
        queues = list(paginator.paginate_queryset(Queue.objects.order_by("id"), request, self) or [])
        statuses = queue_status.statuses(queues)
        items = [{**queue_services.rendered(q), "status": statuses[q.id]} for q in queues]
        return Response({"apiVersion": API_VERSION, "kind": "QueueList", "metadata": paginator.list_metadata(),
                         "items": items})

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: OpenApiTypes.OBJECT},
                   summary="Create a Queue (admins)")
    def post(self, request):
        queue = queue_services.create_queue(request.data)
        response = self.render(queue, status.HTTP_201_CREATED, written=True)
        response["Location"] = f"{request.path.rstrip('/')}/{queue.name}"
        return response


class QueueDetailView(QueueBase):
    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="Read a Queue")
    def get(self, request, name):
        queue = Queue.objects.get(name=name)
        if not_modified(request, queue.resource_version):
            response = Response(status=status.HTTP_304_NOT_MODIFIED)
            response["ETag"] = etag_for(queue.resource_version)
            return response
        return self.render(queue)

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=[IF_MATCH_PARAMETER],
                   responses={200: OpenApiTypes.OBJECT, 201: OpenApiTypes.OBJECT}, summary="Replace a Queue")
    def put(self, request, name):
        queue, created = queue_services.replace_queue(name, request.data, if_match(request))
        return self.render(queue, 201 if created else 200, written=True)

    @extend_schema(request=OpenApiTypes.OBJECT, parameters=[IF_MATCH_PARAMETER],
                   responses={200: OpenApiTypes.OBJECT}, summary="Change a Queue (JSON merge patch)")
    def patch(self, request, name):
        return self.render(queue_services.patch_queue(name, request.data, if_match(request)), written=True)

    @extend_schema(parameters=[IF_MATCH_PARAMETER, FORCE], responses={204: None}, summary="Delete a Queue")
    def delete(self, request, name):
        force = (request.query_params.get("force") or "").lower() in ("true", "1", "yes")
        queue_services.delete_queue(name, if_match(request), force=force)
        return Response(status=status.HTTP_204_NO_CONTENT)


class QueueWebhookListBase(QueueBase):
    """A queue's webhook records, newest last, paginated like every list (``limit``, ``continue``)."""

    kind = ""

    def rows(self, queue: Queue, access):
        raise NotImplementedError

    def render_row(self, row) -> dict:
        raise NotImplementedError

    def get(self, request, name):
        queue = Queue.objects.get(name=name)
        access = access_for(request)
        paginator = KubeListPagination()
        rows = list(paginator.paginate_queryset(self.rows(queue, access), request, self) or [])
        return Response({"apiVersion": API_VERSION, "kind": self.kind, "metadata": paginator.list_metadata(),
                         "items": [self.render_row(r) for r in rows]})


class QueueDeliveryListView(QueueWebhookListBase):
    """The queue's webhook deliveries, those about namespaces the caller reads (a notice names the claim it is
    about): a namespace token sees its namespaces' only, as with claims."""

    kind = "WebhookDeliveryList"

    def rows(self, queue: Queue, access):
        found = WebhookDelivery.objects.filter(owner=queue_webhooks.owner(queue.name)).order_by("id")
        if access.kind == APIToken.NAMESPACE:
            return found.filter(namespace__in=sorted(access.namespaces))
        return found

    def render_row(self, row) -> dict:
        return deliveries.rendered(row)

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="List a Queue's webhook deliveries")
    def get(self, request, name):
        return super().get(request, name)


class QueueWebhookEventListView(QueueWebhookListBase):
    """What happened to the queue's webhook that no delivery shows (a generated secret). Admins only."""

    kind = "WebhookEventList"

    def rows(self, queue: Queue, access):
        found = WebhookEvent.objects.filter(owner=queue_webhooks.owner(queue.name)).order_by("id")
        return found if access.is_admin else found.none()

    def render_row(self, row) -> dict:
        return {"reason": row.reason, "message": row.message,
                "createdAt": row.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")}

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="List a Queue's webhook events (admins)")
    def get(self, request, name):
        return super().get(request, name)
