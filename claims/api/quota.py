"""``/api/v1/namespaces/{namespace}/objectquota``: a namespace's object-count caps (``claims.services.caps``).

Readers of the namespace see its caps and use; only admins change them (PUT replaces, PATCH merges, DELETE goes
back to the defaults). Thin: the service validates and writes."""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from claims import k8s
from claims.services import caps
from draservice.parsers import JSONParser, MergePatchParser
from draservice.permissions import IsAdminOrReadOnly, NamespaceAccess
from draservice.problems import FieldError
from draservice.yaml import YAMLParser


class ObjectQuotaView(APIView):
    permission_classes = [NamespaceAccess, IsAdminOrReadOnly]
    parser_classes = [JSONParser, YAMLParser, MergePatchParser]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        errors = k8s.check_dns_label(kwargs["namespace"], "metadata.namespace")
        if errors:
            raise FieldError(errors)

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, summary="A namespace's object caps and their use")
    def get(self, request, namespace):
        return Response(caps.render(namespace))

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT},
                   summary="Set a namespace's object caps (admins; caps not named go back to the defaults)")
    def put(self, request, namespace):
        return Response(caps.update(namespace, request.data, replace=True))

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT},
                   summary="Change some of a namespace's object caps (admins; null: the default)")
    def patch(self, request, namespace):
        return Response(caps.update(namespace, request.data, replace=False))

    @extend_schema(responses={204: None}, summary="Give a namespace the default object caps (admins)")
    def delete(self, request, namespace):
        caps.reset(namespace)
        return Response(status=status.HTTP_204_NO_CONTENT)
