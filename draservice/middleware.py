"""Request checks that belong before any view (a NUL character in the URL), and which requests need a browser's
middleware at all (``BrowserMiddleware``).

PostgreSQL cannot hold a NUL in text, so ``/api/v1/namespaces/a%00b/...`` or ``?name=a%00b`` would reach a
query and fail there as a DataError (a 500). No name, label or filter value may contain one, so the
request is refused here, once for every route (the body's NULs are refused by ``draservice.parsers``).
"""
from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponseBadRequest
from django.utils.module_loading import import_string

from draservice.problems import is_api_path, json_problem

NUL = "\x00"


class RejectNULMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        where = _nul_in_url(request)
        if where is not None:
            reason = "Invalid value: must not contain a NUL character (%00)"
            if is_api_path(request.path.replace(NUL, "")):
                return json_problem(400, "Bad Request", f"{where}: {reason}", [{"field": where, "reason": reason}])
            return HttpResponseBadRequest(f"{where}: {reason}", content_type="text/plain")
        return self.get_response(request)


def _nul_in_url(request) -> str | None:
    """Where the first NUL is: "path", or the query parameter's name; None without one."""
    if NUL in request.path:
        return "path"
    query = request.META.get("QUERY_STRING", "")
    if "%00" not in query and NUL not in query:
        return None  # the decoded query can only hold a NUL that was sent as one: skip parsing it
    for key, values in request.GET.lists():
        if NUL in key or any(NUL in v for v in values):
            return key.replace(NUL, "\\u0000")
    return None


# The doors a token is for: the REST API, the Kubernetes door (DRF views, or views that read no caller), the
# metrics (which read the token first) and the health checks. The dashboard and the admin always get a browser's
# middleware, whatever headers come with the request.
TOKEN_DOORS = ("/api/", "/k8s/")
TOKEN_PATHS = frozenset({"/metrics", "/livez", "/readyz"})


def bearer(request) -> bool:
    """A request to a token's door that names an API token (``Authorization: Bearer …``): DRF's token
    authentication decides who it is, and a browser session never does (``draservice.auth``)."""
    if request.META.get("HTTP_AUTHORIZATION", "")[:7].lower() != "bearer ":
        return False
    path = request.path_info
    return path.startswith(TOKEN_DOORS) or path in TOKEN_PATHS


class BrowserMiddleware:
    """The browser's middleware (settings.BROWSER_MIDDLEWARE: session, CSRF, the session's user, messages), run
    for every request but one that carries a Bearer token to a token's door (``bearer``).

    A token request is the token's: the token authenticates it (it never falls back to the session), so it needs
    no session, no CSRF check (a browser cannot attach the header to a forged cross-site request, and the session
    is not even loaded) and no messages, and together they cost about 40 us of CPU per request, a tenth of the
    server's cheapest answer. Its ``request.user`` is anonymous until DRF's authentication sets the token's.
    Everything else (the dashboard, the API from a logged-in browser) gets them all, in their order; their
    ``process_view`` hook (the CSRF check) runs for those requests only."""

    def __init__(self, get_response):
        from django.contrib.auth.models import AnonymousUser  # here: the auth app's models need the app registry

        self.get_response = get_response
        self.anonymous = AnonymousUser()
        chain = get_response
        self.view_hooks: list = []
        for path in reversed(settings.BROWSER_MIDDLEWARE):
            instance = import_string(path)(chain)
            if hasattr(instance, "process_view"):
                self.view_hooks.insert(0, instance.process_view)
            chain = convert_exception_to_response(instance)  # as Django wraps every middleware
        self.browser = chain

    def __call__(self, request):
        if bearer(request):
            request.user = self.anonymous
            request._dra_bearer = True
            return self.get_response(request)
        request._dra_bearer = False
        return self.browser(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        if not getattr(request, "_dra_bearer", False):
            for hook in self.view_hooks:
                response = hook(request, view_func, view_args, view_kwargs)
                if response is not None:
                    return response
        return None
