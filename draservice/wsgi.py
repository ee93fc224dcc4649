"""The WSGI entry point (gunicorn: ``draservice.wsgi:application``; ``manage.py serve`` loads it too).

The request body is always read to its end before the response leaves. Django does not read a body the view
never asked for (a 404 or 403 on a PATCH, a DELETE with DeleteOptions, any chunked body), and gunicorn's
threaded worker then reads the rest only *after* sending the response. On a keep-alive connection the client
may have sent its next request by then: gunicorn's read pulls that request into its own buffer together with
the old body, the socket no longer looks readable, nobody parses the buffered request, and the connection is
closed at the keep-alive timeout without a response (RemoteDisconnected on the client; about 3 in 1,000
requests of a PATCH-404 / GET mix under load). Draining here, before the response, leaves the next request
in the socket where gunicorn's poller sees it. See benchmarks/keepalive_bench.py.
"""
import logging
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")

log = logging.getLogger(__name__)

# Beyond this much unread body the response goes first and gunicorn discards the rest afterwards (as before):
# a client that sent megabytes the service refused should get its error now, not after its upload ends.
DRAIN_LIMIT = 1024 * 1024


def drain_request_body(app):
    def application(environ, start_response):
        result = app(environ, start_response)
        # Only where the server promises that reading to EOF stops at the body's end (gunicorn, mod_wsgi):
        # elsewhere (PEP 3333) reading past CONTENT_LENGTH could block on the connection.
        stream = environ.get("wsgi.input") if environ.get("wsgi.input_terminated") else None
        try:
            left = DRAIN_LIMIT
            while stream is not None and left > 0:
                chunk = stream.read(min(64 * 1024, left))
                if not chunk:
                    break
                left -= len(chunk)
        except Exception as exc:  # noqa: BLE001 - a client gone mid-body: the response still goes, gunicorn closes
            log.debug("request body not drained: %s", exc)
        return result
    return application


application = drain_request_body(get_wsgi_application())
