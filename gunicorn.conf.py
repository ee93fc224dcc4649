"""gunicorn's configuration for every production-like start: the README's "Running for real", the Dockerfile's
CMD and docker-compose.yml all run ``gunicorn -c gunicorn.conf.py draservice.wsgi:application --bind ...``.
(``make run`` uses ``manage.py serve``, one process with the in-process worker, configured in that command.)

The address stays on the command line (``--bind``) because it differs between a host and a container.
WEB_WORKERS / WEB_THREADS size the server; everything else here is behaviour, with its reason.
"""
import glob
import os
import shutil
import tempfile

wsgi_app = "draservice.wsgi:application"

# Threads, because a ``?wait=60s`` long poll holds one for up to two minutes; idle keep-alive connections
# hold none (gthread parks them in its poller). Each thread may hold a PostgreSQL connection.
worker_class = "gthread"
workers = int(os.environ.get("WEB_WORKERS", "4"))
threads = int(os.environ.get("WEB_THREADS", "8"))

# Keep-alive longer than any client's or proxy's idle time. A server that closes an idle connection races
# with a client sending on it: the request is lost with no response, and clients retry only idempotent
# methods, so a POST or PATCH fails. With the server's timeout the longest in the chain, the other side
# always closes first. 75 s > the 60 s idle timeout of common load balancers (AWS ALB, nginx upstreams);
# raise it above any longer one in front of the service. gunicorn's default is 2 s.
keepalive = 75

# gthread's timeout only watches the worker's main loop (requests run in threads, so a long poll is not
# "silent"). Generous, because killing a worker drops every connection it holds.
timeout = 120

# On SIGTERM (a deploy, `docker compose stop`) a worker stops accepting, answers what is in flight and
# what arrives on its open connections with "Connection: close", and closes the rest after this long.
# docker-compose.yml's stop_grace_period is longer, so Docker never SIGKILLs in the middle of it.
graceful_timeout = 30

# No max_requests: recycling a worker closes all its idle keep-alive connections when its grace period
# ends, the very race keep-alive above avoids. Nothing in the service leaks enough to need it.
max_requests = 0

# The worker heartbeat file: on a container's overlay filesystem writes can stall for seconds; memory
# does not (gunicorn's own advice for Docker).
if os.path.isdir("/dev/shm"):
    worker_tmp_dir = "/dev/shm"

errorlog = "-"
accesslog = "-" if os.environ.get("ACCESS_LOG", "").lower() in ("1", "true", "yes", "on") else None


def post_worker_init(worker):
    # As `manage.py serve` does with a broker: subscribe to claim changes before the first request, so a
    # long poll is woken by Redis rather than by its next database re-check.
    from draservice import notify

    notify.start_listener()


# prometheus_client's multiprocess mode for the request metrics (draservice.metrics): each worker writes its
# counters to files in this directory and a scrape, whichever worker answers it, sums them all. Without it a
# scrape would see one worker's counters at random and rate() would be noise. Set here, in the master, before
# any worker imports prometheus_client (the mode is chosen at import: nothing in this file may import it at
# the top). The directory must start empty: files left by an earlier server would be counted again.
_created: dict[str, str] = {}


def on_starting(server):
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for stale in glob.glob(os.path.join(path, "*.db")):
            os.remove(stale)
    else:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _created["dir"] = tempfile.mkdtemp(prefix="draservice-metrics-",
                                                                                    dir=shm)


def on_exit(server):
    # Only a directory this server made up itself; one the operator named is theirs to keep.
    if _created.get("dir"):
        shutil.rmtree(_created.pop("dir"), ignore_errors=True)


def child_exit(server, worker):
    # A dead worker's gauges (none today; histograms and counters are kept) are dropped from the sums.
    # Imported here, not at the top: prometheus_client picks its value store when first imported, and
    # workers forked from a master that had imported it before on_starting would inherit the
    # single-process store (and /metrics would then read an empty directory).
    from prometheus_client import multiprocess

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(worker.pid)
