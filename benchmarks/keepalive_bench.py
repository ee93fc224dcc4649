"""Keep-alive benchmark: do connections reused by HTTP clients ever get closed without a response?

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python benchmarks/keepalive_bench.py

What it does:
1. creates a fresh database ``<DATABASE_URL's name>_keepalive_bench``, migrates it and makes an admin token;
2. starts gunicorn exactly as the README, the Dockerfile and docker-compose.yml do
   (``gunicorn -c gunicorn.conf.py draservice.wsgi:application``: 4 processes x 8 threads), with Celery
   tasks going to a Redis database no worker reads (KA_BROKER_URL, default redis://127.0.0.1:6379/13,
   FLUSHED at start) - the claims stay Pending, which is all this needs;
3. runs KA_REQUESTS (10,000) requests from KA_CLIENTS (16) threads, each thread one ``requests.Session``
   holding ONE keep-alive connection and never retrying, cycling through a claim's life: POST -> GET ->
   PATCH (merge patch) -> GET list -> DELETE with DeleteOptions -> PATCH and GET of the deleted claim (404).
   The last three carry or follow bodies the service never reads - what used to lose the next request.
   Before KA_IDLE_FRACTION (2 %) of the requests the thread sits idle for a random KA_IDLE_MIN..KA_IDLE_MAX
   seconds (0.5..4), as a CI job between steps does: that exposes a server that closes idle keep-alive
   connections early (gunicorn's default keep-alive is 2 s).

It prints requests, resets (requests that got no response: RemoteDisconnected, ECONNRESET, a 30 s
timeout...) by method, TCP connections opened, ``Connection: close`` answers, and p50/p99 latency. Exit status
1 when any request got no response. ``--legacy`` runs the README's command from before gunicorn.conf.py
(``--workers 4 --threads 8``, gunicorn's defaults otherwise: keep-alive 2 s) for comparison.

Findings (2 CPUs, 10,003 requests, 16 threads):
* before - the legacy command and no body drain in draservice.wsgi: 71 requests lost (GET 58, PATCH 13),
  each the request right after one whose body the service did not read; 198 TCP connections;
* after - gunicorn.conf.py and the drain: 0 lost, 16 TCP connections (none ever closed), p50 97 ms, p99 573 ms;
* the drain alone, keep-alive still 2 s: 0 lost, 135 connections (servers' idle closes that urllib3 saw in
  time; one arriving while the client sends would still lose that request);
* keep-alive 75 s without the drain (the test's 2,002 requests): 35 requests hung until the client's timeout.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
LEGACY_ARGS = ["-c", "/dev/null", "--workers", "4", "--threads", "8"]  # the README command before the fix
CONFIG_ARGS = ["-c", str(ROOT / "gunicorn.conf.py")]


@dataclass
class Result:
    requests: int = 0
    resets: Counter = field(default_factory=Counter)       # method -> requests that got no response
    errors: list = field(default_factory=list)              # (method, path, exception text), first few
    statuses: Counter = field(default_factory=Counter)
    close_answers: int = 0                                  # responses carrying "Connection: close"
    connections: int = 0                                    # TCP connections the clients opened
    latencies: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_resets(self) -> int:
        return sum(self.resets.values())

    def summary(self) -> str:
        lat = sorted(self.latencies) or [0.0]
        p50, p99 = lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        by_method = ", ".join(f"{m} {n}" for m, n in sorted(self.resets.items())) or "none"
        return (f"requests {self.requests} in {self.seconds:.1f} s ({self.requests / max(self.seconds, 1e-9):.0f}/s)\n"
                f"resets (no response) {self.total_resets}: {by_method}\n"
                f"TCP connections opened {self.connections}, 'Connection: close' answers {self.close_answers}\n"
                f"statuses {dict(sorted(self.statuses.items()))}\n"
                f"latency p50 {p50:.1f} ms, p99 {p99:.1f} ms")


# ------------------------------------------------------------------------------------------ the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_database(database_url: str, python: str = sys.executable) -> str:
    """Drop and create the database, migrate it, and return a fresh admin token."""
    import psycopg

    name = urlparse(database_url).path.lstrip("/")
    admin = database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": database_url, "CELERY_BROKER_URL": ""}
    subprocess.run([python, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    out = subprocess.run([python, "manage.py", "create_token", "--admin"], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    return re.search(r"dra_\S+", out).group(0)


def drop_database(database_url: str) -> None:
    import psycopg

    name = urlparse(database_url).path.lstrip("/")
    with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Gunicorn:
    """gunicorn as a subprocess on a free port; ``args`` choose the configuration (CONFIG_ARGS / LEGACY_ARGS)."""

    def __init__(self, args: list[str], env: dict, log_path: Path, app: str = "draservice.wsgi:application"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop(), it outlives this method
        # --bind on the command line overrides the configuration file's, as an operator's would.
        self.proc = subprocess.Popen([gunicorn, *args, "--bind", f"127.0.0.1:{self.port}",
                                      app], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if requests.get(self.url + "/livez", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError(f"gunicorn did not answer /livez in {timeout} s; see {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------------------------------ the clients

def create_device_class(base: str, token: str) -> None:
    """The class the claims ask for (they stay Pending: there is no fleet and no worker)."""
    import json

    import requests

    body = next(c for c in json.loads((ROOT / "inventory" / "demo" / "deviceclasses.json").read_text())
                if c["metadata"]["name"] == "gpu.nvidia.com")
    resp = requests.post(f"{base}/api/v1/deviceclasses", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {token}"})
    resp.raise_for_status()


CLAIM = ('{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{{"name":"{name}"}},'
         '"spec":{{"devices":{{"requests":[{{"name":"gpu","exactly":{{"deviceClassName":"gpu.nvidia.com"}}}}]}}}}}}')


DELETE_OPTIONS = '{"apiVersion":"v1","kind":"DeleteOptions","propagationPolicy":"Background"}'
PATCH_BODY = '{"metadata":{"labels":{"step":"patched"}}}'
MERGE_PATCH = "application/merge-patch+json"


def _cycle(base: str, namespace: str, name: str) -> list[tuple[str, str, str | None, str | None]]:
    """One claim's life as a CI job lives it: (method, url, body, content type). The last three requests
    carry bodies the service never reads (Kubernetes clients send DeleteOptions with a DELETE; a PATCH of a
    claim already gone is a 404 before its body matters) - the requests that used to lose the next one."""
    claims = f"{base}/api/v1/namespaces/{namespace}/resourceclaims"
    return [("POST", claims, CLAIM.format(name=name), "application/json"),
            ("GET", f"{claims}/{name}", None, None),
            ("PATCH", f"{claims}/{name}", PATCH_BODY, MERGE_PATCH),
            ("GET", f"{claims}?limit=20", None, None),
            ("DELETE", f"{claims}/{name}", DELETE_OPTIONS, "application/json"),
            ("PATCH", f"{claims}/{name}", PATCH_BODY, MERGE_PATCH),
            ("GET", f"{claims}/{name}", None, None)]


CYCLE = 7  # requests per _cycle


def _session(token: str):
    """A requests.Session with ONE keep-alive connection, no retries (every request that got no response is
    counted, not hidden) and a count of the TCP connections it opened (``session.connects[0]``)."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection

    connects = [0]

    class CountingConnection(HTTPConnection):
        def connect(self):
            connects[0] += 1
            return super().connect()

    class Adapter(HTTPAdapter):
        def get_connection_with_tls_context(self, *args, **kwargs):
            pool = super().get_connection_with_tls_context(*args, **kwargs)
            pool.ConnectionCls = CountingConnection
            return pool

    session = requests.Session()
    session.mount("http://", Adapter(pool_connections=1, pool_maxsize=1, max_retries=0))
    session.headers["Authorization"] = f"Bearer {token}"
    session.connects = connects
    return session


def _client(ident: int, base: str, token: str, budget, result: Result, lock: threading.Lock, idle) -> None:
    import requests

    rng = random.Random(ident)
    session = _session(token)
    local = Result()
    n = 0
    while budget():
        for method, url, body, ctype in _cycle(base, f"ka-{ident}", f"c{n}"):
            if idle and rng.random() < idle[0]:
                time.sleep(rng.uniform(idle[1], idle[2]))
            started = time.perf_counter()
            try:
                resp = session.request(method, url, data=body, timeout=30,
                                       headers={"Content-Type": ctype} if ctype else None)
            except requests.RequestException as exc:
                # ConnectionError: closed or reset without a response; Timeout: no response within 30 s (a
                # request stuck in the server's buffer waits for its keep-alive timeout). Both lose the request.
                local.resets[method] += 1
                if len(local.errors) < 5:
                    local.errors.append((time.strftime("%H:%M:%S"), method, url.split("/api/v1")[-1],
                                         repr(exc.__context__ or exc)[:160]))
            else:
                local.latencies.append(time.perf_counter() - started)
                local.statuses[resp.status_code] += 1
                local.close_answers += resp.headers.get("Connection", "").lower() == "close"
            local.requests += 1
        n += 1
    local.connections = session.connects[0]
    with lock:
        result.requests += local.requests
        result.resets.update(local.resets)
        result.errors += local.errors
        result.statuses.update(local.statuses)
        result.close_answers += local.close_answers
        result.connections += local.connections
        result.latencies += local.latencies


def run_load(base: str, token: str, requests: int, clients: int, idle=(0.02, 0.5, 4.0)) -> Result:
    """``requests`` requests (rounded up to whole claim cycles) from ``clients`` threads; ``idle`` is
    (fraction of requests preceded by a pause, shortest pause, longest pause) or None."""
    cycles = iter(range(-(-requests // CYCLE)))
    cycles_lock = threading.Lock()

    def budget() -> bool:
        with cycles_lock:
            return next(cycles, None) is not None

    result, lock = Result(), threading.Lock()
    started = time.perf_counter()
    threads = [threading.Thread(target=_client, args=(i, base, token, budget, result, lock, idle))
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - started
    return result


# ------------------------------------------------------------------------------------------ main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=int(os.environ.get("KA_REQUESTS", "10000")))
    p.add_argument("--clients", type=int, default=int(os.environ.get("KA_CLIENTS", "16")))
    p.add_argument("--idle-fraction", type=float, default=float(os.environ.get("KA_IDLE_FRACTION", "0.02")))
    p.add_argument("--idle-min", type=float, default=float(os.environ.get("KA_IDLE_MIN", "0.5")))
    p.add_argument("--idle-max", type=float, default=float(os.environ.get("KA_IDLE_MAX", "4")))
    p.add_argument("--legacy", action="store_true", help="the README's command before gunicorn.conf.py")
    p.add_argument("--gunicorn-args", help="other gunicorn options instead (e.g. '-c /dev/null --keep-alive 5')")
    p.add_argument("--app", default="draservice.wsgi:application", help="the WSGI application gunicorn serves")
    args = p.parse_args()

    base_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/draservice")
    if not base_url.startswith("postgres"):
        sys.exit("keepalive_bench needs PostgreSQL: set DATABASE_URL=postgresql://...")
    db_url = base_url.rsplit("/", 1)[0] + "/" + urlparse(base_url).path.lstrip("/") + "_keepalive_bench"
    broker = os.environ.get("KA_BROKER_URL", "redis://127.0.0.1:6379/13")
    gargs = args.gunicorn_args.split() if args.gunicorn_args else LEGACY_ARGS if args.legacy else CONFIG_ARGS

    token = prepare_database(db_url)
    import redis

    redis.Redis.from_url(broker).flushdb()
    env = {**os.environ, "DATABASE_URL": db_url, "CELERY_BROKER_URL": broker, "LOG_LEVEL": "WARNING"}
    (ROOT / "bench-results").mkdir(exist_ok=True)
    server = Gunicorn(gargs, env, ROOT / "bench-results" / "keepalive_gunicorn.log", args.app)
    try:
        server.wait_ready()
        create_device_class(server.url, token)
        print(f"gunicorn {' '.join(gargs)} {args.app}; {args.clients} client threads, one keep-alive connection each; "
              f"{args.idle_fraction:.0%} of requests after {args.idle_min}-{args.idle_max} s idle")
        result = run_load(server.url, token, args.requests, args.clients,
                          (args.idle_fraction, args.idle_min, args.idle_max) if args.idle_fraction else None)
    finally:
        server.stop()
        drop_database(db_url)
    print(result.summary())
    for when, method, path, error in sorted(result.errors)[:10]:
        print(f"  {when} {method} {path}: {error}")
    return 1 if result.total_resets else 0


if __name__ == "__main__":
    sys.exit(main())
