"""``manage.py watch_server --port 8001``: the /k8s door's watches (``?watch=1``) in a process of their own
(``kube.watch_server``, on uvicorn). A reverse proxy routes watch requests here and everything else to
gunicorn (README, "Watches"); with ``--upstream`` this server is that proxy itself (what ``manage.py serve``
does on its public port)."""
from __future__ import annotations

import os
import resource

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Serve /k8s watches (?watch=1) asynchronously; with --upstream, pass every other request to it."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("WATCH_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("WATCH_PORT", "8001")))
        parser.add_argument("--upstream", default=os.environ.get("WATCH_UPSTREAM", ""),
                            help="the web server (http://host:port) that answers every request but watches")
        parser.add_argument("--certfile", default=os.environ.get("TLS_CERTFILE", ""))
        parser.add_argument("--keyfile", default=os.environ.get("TLS_KEYFILE", ""))
        parser.add_argument("--access-log", action="store_true", help="log every request")

    def handle(self, *args, host, port, upstream, certfile, keyfile, access_log, **opts):
        import uvicorn

        from kube.watch_server import WatchServer

        if bool(certfile) != bool(keyfile):
            raise CommandError("--certfile and --keyfile go together")
        _raise_open_files_limit()
        scheme = "https" if certfile else "http"
        self.stdout.write(f"draservice watch server on {scheme}://{host}:{port}/"
                          + (f", other requests to {upstream}" if upstream else ""))
        # uvloop and httptools: a thousand watches' events cost a fraction of the CPU asyncio and h11 take.
        config = uvicorn.Config(
            WatchServer(upstream or None), host=host, port=port, loop="uvloop", http="httptools", lifespan="on",
            ssl_certfile=certfile or None, ssl_keyfile=keyfile or None, access_log=access_log,
            log_level=os.environ.get("LOG_LEVEL", "info").lower(),
            # As gunicorn.conf.py: keep idle connections longer than any proxy or client does.
            timeout_keep_alive=75,
            # On SIGTERM, open watches are ended after this long; their clients reconnect elsewhere.
            timeout_graceful_shutdown=5, backlog=2048)
        uvicorn.Server(config).run()


def _raise_open_files_limit() -> None:
    """Every watch is an open socket: allow as many as the hard limit does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
