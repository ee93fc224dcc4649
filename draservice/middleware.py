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


class DrainRequestBodyMiddleware:
    """Read what is left of the request body before the response leaves (outermost middleware).

    An answer given without reading the body (405, 401/403, 404 on an unknown ``?format=``, a 400 from a
    check above) used to stall the client's next request on that keep-alive connection until it gave up:
    gunicorn's threaded worker discards the unread body only after sending the response, by which time the
    client may already have sent its next request; the read that takes the body's last bytes then takes the
    start of the next request into the parser's buffer, and the connection goes back to a poller that waits
    for bytes already read (gunicorn 24.1, workers/gthread.py). Reading the body here, before the response
    is sent, means nothing of the next request can be on the wire yet, whatever server runs us.
    """

    CHUNK = 64 * 1024

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        stream = getattr(request, "_stream", None)  # Django's LimitedStream over wsgi.input (Content-Length)
        if stream is not None:
            try:
                while stream.read(self.CHUNK):
                    pass
            except OSError:  # the client went away: nothing to keep alive
                pass
        return response
