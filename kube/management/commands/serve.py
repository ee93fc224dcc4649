"""``manage.py serve --port 8000``: the web server, plus the in-process worker when there is no broker.

* No ``CELERY_BROKER_URL`` (the embedded default, what ``make run`` uses): ONE gunicorn worker process
  with threads, and in it the ``draservice.runner.PeriodicRunner`` thread that allocates claims and runs the
  beat schedule (lease expiry, stale sweep, utilisation snapshots, retries), and a second one, the notify
  runner, that delivers webhooks (a slow receiver holds it, never allocation). One process, because the
  runners must exist once and SQLite serializes writers anyway.
* With a broker: several gunicorn worker processes; allocation and the schedule belong to
  ``celery -A draservice worker``, webhook deliveries to ``celery -A draservice worker -Q notify`` and the
  schedule to ``celery -A draservice beat`` (see docker-compose.yml).

Watches (``/k8s ...?watch=1``) are served by the watch server (``manage.py watch_server``, asyncio), not by
gunicorn's threads, so that one tenant's watches cannot take the threads other tenants' requests need. It
listens on the public port and passes every other request to gunicorn on a loopback port
(``kube.watch_proxy`` says why a front rather than a redirect). ``--no-watch-server``: gunicorn alone on the
public port, serving watches from its threads as before (``KUBE_MAX_WATCHES`` per process).

Threads: each request, including each ``?wait=`` long poll (up to 120 s), holds one thread. ``--threads``
sets them per process; long-poll-heavy deployments raise it (threads are cheap while they sleep) and make
sure the database allows one connection per thread.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from draservice import tls as https_tls
from draservice.models import APIToken
from draservice.tls import certificate
from draservice.tokens import issue_token

KUBECONFIG_TOKEN = "serve --https-port kubeconfig"


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


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
        parser.add_argument("--no-watch-server", action="store_true",
                            help="no separate watch server: gunicorn serves /k8s watches from its threads")
        parser.add_argument("--tls", action="store_true", default=os.environ.get("TLS", "") == "true",
                            help="serve HTTPS (TLS_CERTFILE/TLS_KEYFILE, or a self-signed localhost certificate "
                                 "under VAR_DIR/tls): kubectl sends its token only over HTTPS")
        parser.add_argument("--https-port", type=int, default=int(os.environ.get("HTTPS_PORT") or 0) or None,
                            help="also serve HTTPS on this port (plain HTTP stays on --port; the certificate as for "
                                 "--tls) and write an admin kubeconfig for it to VAR_DIR/kubeconfig (what `make "
                                 "run` does, with PORT+443)")
        parser.add_argument("--demo", action="store_true",
                            help="load the demo fleet and keep its fake clusters fresh (what `make run` does; "
                                 "never in production: claims would land on nodes that do not exist)")

    def handle(self, *args, host, port, workers, threads, no_runner, access_log, demo, tls=False, https_port=None,
               no_watch_server=False, **opts):
        from gunicorn.app.base import BaseApplication  # type: ignore[import-untyped]

        broker = bool(settings.CELERY_BROKER_URL)
        run_inline_worker = not broker and not no_runner
        workers = _checked_workers(workers, threads, broker, run_inline_worker)
        if https_port and (tls or https_port == port):
            raise CommandError("--https-port serves HTTPS beside the plain --port: not with --tls, not on --port")
        if demo:
            self._start_demo()
        upstream = https_tls.upstream_socket() if https_port else None
        if upstream is not None:
            https_tls.certificate()  # made before the kubeconfig that trusts it
            upstream.unlink(missing_ok=True)
            self._write_kubeconfig(f"https://{_url_host(host)}:{https_port}/k8s")

        def post_worker_init(worker):
            if upstream is not None:
                https_tls.start_terminator(host, https_port, upstream)
            if run_inline_worker:
                from draservice.runner import start_runners

                start_runners()
            else:
                from draservice import notify

                notify.start_listener()  # long polls are woken from Redis; be subscribed before the first

        watch_server: list = []  # the watch server's process, once started

        def on_exit(server):
            for proc in watch_server:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()

        bind = f"{host}:{port}"
        if not no_watch_server:
            bind = f"127.0.0.1:{_free_loopback_port()}"
        config = {
            # make run's HTTPS terminator hands its requests to gunicorn's Unix socket directly: watches that
            # come in over HTTPS are served by gunicorn's threads (KUBE_MAX_WATCHES), not the watch server.
            "bind": [bind] + ([f"unix:{upstream}"] if upstream is not None else []),
            "workers": workers,
            "worker_class": "gthread",
            "threads": threads,
            "timeout": 180,  # > the longest long poll (draservice.requests.MAX_WAIT)
            "graceful_timeout": 15,
            "keepalive": 30,
            "accesslog": "-" if access_log else None,
            "errorlog": "-",
            "post_worker_init": post_worker_init,
            "on_exit": on_exit,
        }
        if tls and no_watch_server:
            config["certfile"], config["keyfile"] = certificate()

        class Application(BaseApplication):
            def load_config(self):
                for key, value in config.items():
                    self.cfg.set(key, value)

            def load(self):
                from draservice.wsgi import application

                return https_tls.behind_terminator(application) if upstream is not None else application

        mode = "in-process worker (no broker)" if run_inline_worker else (
            "Celery workers via the broker" if broker else "no allocation worker (--no-runner)")
        self._banner(host, port, tls, https_port if upstream is not None else None, workers, threads, mode)
        connections.close_all()  # never share a database connection across gunicorn's fork
        if not no_watch_server:
            watch_server.append(self._start_watch_server(host, port, f"http://{bind}", tls))
            self.stdout.write(f"watches (/k8s ?watch=1) in their own process (pid {watch_server[0].pid}); "
                              f"gunicorn on {bind}")
        Application().run()

    def _banner(self, host: str, port: int, tls: bool, https_port: int | None, workers: int, threads: int,
                mode: str) -> None:
        scheme = "https" if tls else "http"
        self.stdout.write(f"draservice on {scheme}://{host}:{port}/ - {workers} process(es) x {threads} threads; "
                          f"allocation: {mode}")
        if https_port is not None:
            self.stdout.write(f"and on https://{_url_host(host)}:{https_port}/ (kubectl: "
                              f"KUBECONFIG={https_tls.kubeconfig_path()} kubectl get resourceslices)")

    def _write_kubeconfig(self, server: str) -> None:
        """An admin kubeconfig for the HTTPS door, replacing the one an earlier run wrote (and its token)."""
        from inventory.management.commands.create_token import kubeconfig

        APIToken.objects.filter(name=KUBECONFIG_TOKEN).delete()
        _, secret = issue_token(kind=APIToken.ADMIN, name=KUBECONFIG_TOKEN)
        path = https_tls.kubeconfig_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(kubeconfig(server, secret, "default"))
        path.chmod(0o600)

    def _start_watch_server(self, host: str, port: int, upstream: str, tls: bool) -> subprocess.Popen:
        command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "watch_server", "--host", host,
                   "--port", str(port), "--upstream", upstream]
        if tls:
            certfile, keyfile = certificate()
            command += ["--certfile", str(certfile), "--keyfile", str(keyfile)]
        # It ends with this process even when this one is killed (SIGKILL leaves no time for on_exit).
        return subprocess.Popen(command, preexec_fn=_die_with_parent)

    def _start_demo(self) -> None:
        from django.core.management import call_command

        from inventory.tasks import enable_demo_fleet

        call_command("load_demo_fleet", stdout=self.stdout)
        # Before the fork, so the in-process runner of the web worker inherits the demo heartbeat.
        enable_demo_fleet()
        if settings.CELERY_BROKER_URL:
            self.stdout.write("demo fleet: with a broker its heartbeat runs in `celery beat`, "
                              "started with DEMO_FLEET=true")


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)


def _checked_workers(workers: int | None, threads: int, broker: bool, run_inline_worker: bool) -> int:
    """gunicorn's process count: by default a few with a broker, one without (the in-process worker lives there)."""
    if workers is None:
        workers = min(4, 2 * (os.cpu_count() or 1)) if broker else 1
    if run_inline_worker and workers != 1:
        raise CommandError("without a broker the in-process worker runs in the web process: use --workers 1 "
                           "(or configure CELERY_BROKER_URL and run Celery workers)")
    if threads < 1 or workers < 1:
        raise CommandError("--workers and --threads must be at least 1")
    return workers
