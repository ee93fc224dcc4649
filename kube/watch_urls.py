"""The watch server's routes: the /k8s door's resource paths (``kube.urls``), answered by ``WatchView``, which
does everything a watch request needs before its stream (authentication, permissions, selectors, the Watch)
and hands the Watch to ``kube.watch_server`` instead of streaming it from a thread."""
from __future__ import annotations

from django.http import HttpResponse
from django.urls import include, path, re_path

from draservice.permissions import readable_namespaces
from kube import urls as kube_urls
from kube.views import ResourceView
from kube.watch import Watch


class WatchStart(HttpResponse):
    """Not sent: the watch server streams ``watch`` from ``since`` for ``holder`` (whose watches are counted)."""

    def __init__(self, watch: Watch, since: int | None, holder: str, readable: frozenset[str] | None):
        super().__init__(status=200)
        self.watch, self.since, self.holder, self.namespaces = watch, since, holder, readable


def holder_of(request) -> str:
    """Whose watch this is, for the per-token cap: the API token, else the session's user."""
    token_pk = getattr(getattr(request, "auth", None), "pk", None)
    if token_pk is not None:
        return f"token:{token_pk}"
    user = getattr(request, "user", None)
    return f"user:{getattr(user, 'pk', None)}"


class WatchView(ResourceView):
    def _watch(self, request, kw):
        w, since = self.start_watch(request, kw)
        readable = readable_namespaces(request) if self.resource.namespaced and not kw.get("namespace") else None
        return WatchStart(w, since, holder_of(request), readable)


watch_view = WatchView.as_view()
urlpatterns = [path("k8s/", include([re_path(p.pattern.regex.pattern, watch_view)
                                     for p in kube_urls.urlpatterns
                                     if getattr(p, "callback", None) is kube_urls.resource]))]
