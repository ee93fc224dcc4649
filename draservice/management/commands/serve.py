"""``manage.py serve --port 8000``: the web server, plus the in-process worker when there is no broker.

* No ``CELERY_BROKER_URL`` (the embedded default, what ``make run`` uses): ONE gunicorn worker process
  with threads, and in it the ``draservice.runner.PeriodicRunner`` thread that allocates claims and runs the
  beat schedule (lease expiry, stale sweep, utilisation snapshots, retries), and a second one, the notify
  runner, that delivers webhooks (a slow receiver holds it, never allocation). One process, because the
  runners must exist once and SQLite serializes writers anyway.
* With a broker: several gunicorn worker processes; allocation and the schedule belong to
  ``celery -A draservice worker``, webhook deliveries to ``celery -A draservice worker -Q notify`` and the
  schedule to ``celery -A draservice beat`` (see docker-compose.yml).

Threads: each request, including each ``?wait=`` long poll (up to 120 s), holds one thread. ``--threads``
sets them per process; long-poll-heavy deployments raise it (threads are cheap while they sleep) and make
sure the database allows one connection per thread.
"""
from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from draservice.tls import certificate


class Command(BaseCommand):
    help = "Run the web server (gunicorn, threaded); without a broker also the in-process allocation worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--workers", type=int, default=None,
                            help="web worker processes (default: 1 without a broker, else min(4, 2 x CPUs))")
        parser.add_argument("--threads", type=int, default=int(os.environ.get("WEB_THREADS", "32")),
                            help="threads per worker process (default 32; each long poll holds one)")
        parser.add_argument("--no-runner", action="store_true",
                            help="do not start the in-process allocation worker even without a broker")
        parser.add_argument("--access-log", action="store_true", help="log every request")
        parser.add_argument("--tls", action="store_true", default=os.environ.get("TLS", "") == "true",
                            help="serve HTTPS (TLS_CERTFILE/TLS_KEYFILE, or a self-signed localhost certificate "
                                 "under VAR_DIR/tls): kubectl sends its token only over HTTPS")
        parser.add_argument("--demo", action="store_true",
                            help="load the demo fleet and keep its fake clusters fresh (what `make run` does; "
                                 "never in production: claims would land on nodes that do not exist)")

    def handle(self, *args, host, port, workers, threads, no_runner, access_log, demo, tls=False, **opts):
        from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]

        broker = bool(settings.CELERY_BROKER_URL)
        run_inline_worker = not broker and not no_runner
        if workers is None:
            workers = min(4, 2 * (os.cpu_count() or 1)) if broker else 1
        if run_inline_worker and workers != 1:
            raise CommandError("without a broker the in-process worker runs in the web process: use --workers 1 "
                               "(or configure CELERY_BROKER_URL and run Celery workers)")
        if threads < 1 or workers < 1:
            raise CommandError("--workers and --threads must be at least 1")
        if demo:
            self._start_demo()

        def post_worker_init(worker):
            if run_inline_worker:
                from draservice.runner import start_runners

                start_runners()
            else:
                from draservice import notify

                notify.start_listener()  # long polls are woken from Redis; be subscribed before the first

        config = {
            "bind": f"{host}:{port}",
            "workers": workers,
            "worker_class": "gthread",
            "threads": threads,
            "timeout": 180,  # > the longest long poll (draservice.requests.MAX_WAIT)
            "graceful_timeout": 15,
            "keepalive": 30,
            "accesslog": "-" if access_log else None,
            "errorlog": "-",
            "post_worker_init": post_worker_init,
        }
        if tls:
            config["certfile"], config["keyfile"] = certificate()

        class Application(BaseApplication):
            def load_config(self):
                for key, value in config.items():
                    self.cfg.set(key, value)

            def load(self):
                from draservice.wsgi import application

                return application

        mode = "in-process worker (no broker)" if run_inline_worker else (
            "Celery workers via the broker" if broker else "no allocation worker (--no-runner)")
        scheme = "https" if tls else "http"
        self.stdout.write(f"draservice on {scheme}://{host}:{port}/ - {workers} process(es) x {threads} threads; "
                          f"allocation: {mode}")
        connections.close_all()  # never share a database connection across gunicorn's fork
        Application().run()

    def _start_demo(self) -> None:
        from django.core.management import call_command

        from inventory.tasks import enable_demo_fleet

        call_command("load_demo_fleet", stdout=self.stdout)
        # Before the fork, so the in-process runner of the web worker inherits the demo heartbeat.
        enable_demo_fleet()
        if settings.CELERY_BROKER_URL:
            self.stdout.write("demo fleet: with a broker its heartbeat runs in `celery beat`, "
                              "started with DEMO_FLEET=true")
