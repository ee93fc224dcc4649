"""Routes of the /k8s door (a kubeconfig's ``server: https://host/k8s``)."""
from django.urls import path, re_path

from kube import authorization, discovery, openapi
from kube.views import ResourceView, not_found

NAME = r"(?P<name>[^/]+)"
GROUP = r"(?P<group>[a-z0-9][a-z0-9.-]*)"  # apps, batch, resource.k8s.io; the core group is under /api
VERSION = r"(?P<version>v[0-9a-z]+)"
PLURAL = r"(?P<plural>[a-z0-9]+)"
NS = r"namespaces/(?P<namespace>[^/]+)/"
STATUS = r"(?:/(?P<subresource>status|scale))?"

resource = ResourceView.as_view()
urlpatterns = [
    path("version", discovery.version),
    path("version/", discovery.version),
    path("api", discovery.core),
    path("api/", discovery.core),
    path("apis", discovery.group_list),
    path("apis/", discovery.group_list),
    path("openapi/v2", openapi.v2),
    path("openapi/v3", openapi.index),
    path("openapi/v3/", openapi.index),
    re_path(rf"^openapi/v3/apis/{GROUP}/{VERSION}$", openapi.group_version),
    re_path(rf"^openapi/v3/api/{VERSION}$", openapi.group_version),
    path("apis/authorization.k8s.io/v1/selfsubjectaccessreviews", authorization.access_reviews),
    path("apis/authorization.k8s.io/v1/selfsubjectrulesreviews", authorization.rules_reviews),
    re_path(rf"^apis/{GROUP}/?$", discovery.group),
    re_path(rf"^apis/{GROUP}/{VERSION}/?$", discovery.resource_list),
    re_path(rf"^api/{VERSION}/?$", discovery.resource_list),
    re_path(rf"^apis/{GROUP}/{VERSION}/{NS}{PLURAL}/?$", resource),
    re_path(rf"^apis/{GROUP}/{VERSION}/{NS}{PLURAL}/{NAME}{STATUS}$", resource),
    re_path(rf"^apis/{GROUP}/{VERSION}/{PLURAL}/?$", resource),
    re_path(rf"^apis/{GROUP}/{VERSION}/{PLURAL}/{NAME}{STATUS}$", resource),
    re_path(rf"^api/{VERSION}/{NS}{PLURAL}/?$", resource),
    re_path(rf"^api/{VERSION}/{NS}{PLURAL}/{NAME}{STATUS}$", resource),
    re_path(rf"^api/{VERSION}/{PLURAL}/?$", resource),
    re_path(rf"^api/{VERSION}/{PLURAL}/{NAME}{STATUS}$", resource),
    re_path(r"^.*$", not_found),
]
