"""Request checks that belong before any view: a NUL character in the URL.

PostgreSQL cannot hold a NUL in text, so ``/api/v1/namespaces/a%00b/...`` or ``?name=a%00b`` would reach a
query and fail there as a DataError (a 500). No name, label or filter value may contain one, so the
request is refused here, once for every route (the body's NULs are refused by ``draservice.parsers``).
"""
from django.http import HttpResponseBadRequest

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
