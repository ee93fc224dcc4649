"""/metrics under real gunicorn with several workers (gunicorn.conf.py): whichever worker answers a scrape, the
request counters are the sum over all workers, and the database-derived families appear once."""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.services.clusters import create_cluster
from tests.live import free_port

ROOT = Path(__file__).resolve().parents[1]


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    # A new connection each time, so the workers share the requests (no keep-alive pins one).
    req = urllib.request.Request(url, headers={"Connection": "close",
                                               **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def database_url() -> str:
    s = connection.settings_dict
    return f"postgresql://{s['USER']}:{s['PASSWORD'] or ''}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture(params=["named directory", "default"])
def server(request, transactional_db, tmp_path):
    """gunicorn with two workers; the multiprocess directory named by the operator, or gunicorn.conf.py's own
    (``None`` then: the test cannot see it)."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "WEB_WORKERS": "2", "WEB_THREADS": "2",
           "ALLOWED_HOSTS": "127.0.0.1", "CELERY_BROKER_URL": "", "METRICS_PUBLIC": "false", "DEBUG": "false"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    directory = None
    if request.param == "named directory":
        env["PROMETHEUS_MULTIPROC_DIR"] = directory = str(tmp_path)
    proc = subprocess.Popen([str(Path(sys.executable).with_name("gunicorn")), "-c", "gunicorn.conf.py",
                             "draservice.wsgi:application", "--bind", f"127.0.0.1:{port}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                # Not /livez, whose count the test checks: a probe that timed out on the loaded machine is still
                # answered (and counted) once a worker is up, unknown to the test.
                if get(f"{base}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"gunicorn did not start: {proc.communicate()[1].decode()[-2000:]}")
            time.sleep(0.2)
        yield base, directory
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def livez_count(text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "draservice_http_requests_total" and s.labels.get("route") == "livez")


def test_scrapes_sum_the_workers_request_counters(server):
    base, directory = server
    create_cluster(name="c1", labels={}, with_token=False)
    _, token = issue_token(kind=APIToken.ADMIN, name="prometheus", read_only=True)
    # Bursts of concurrent requests until both workers have answered some: the counters then live in two
    # processes. (Sequential requests would all go to whichever idle worker wakes first.) Where the directory
    # is gunicorn's own, a few bursts: a wrong set-up reports no request at all, whichever worker answers.
    sent = 0  # the start-up probes asked /readyz

    def workers_counting() -> int:
        return len(list(Path(directory).glob("counter_*.db"))) if directory else 0

    with ThreadPoolExecutor(16) as pool:
        while (workers_counting() < 2 if directory else sent < 128) and sent < 2000:
            statuses = list(pool.map(lambda _: get(f"{base}/livez")[0], range(32)))
            assert statuses == [200] * 32
            sent += 32
    assert directory is None or workers_counting() >= 2, "one worker answered every request"
    for _ in range(6):  # scrapes land on either worker: each sees the sum
        status, body = get(f"{base}/metrics", token)
        assert status == 200, body[:500]
        text = body.decode()
        assert livez_count(text) == sent
        clusters = [s for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "draservice_clusters"]
        assert [s.value for s in clusters] == [1.0]  # read from the database, once
    assert get(f"{base}/metrics")[0] == 401  # still behind the admin token


def test_gunicorn_conf_sets_up_and_cleans_the_multiprocess_directory(monkeypatch, tmp_path):
    conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    # on_starting sets the variable in os.environ itself: record the original state first, so that the test
    # leaves no variable behind (a later live service would inherit a directory that is gone, and crash).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "recorded")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    conf["on_starting"](None)
    made = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    assert made.is_dir() and not list(made.iterdir())
    conf["on_exit"](None)
    assert not made.exists()  # its own directory goes with the server
    # A directory the operator names is kept, emptied of an earlier server's files (they would count again).
    (tmp_path / "counter_123.db").write_bytes(b"x")
    (tmp_path / "keep.txt").write_text("x")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    conf["on_starting"](None)
    conf["on_exit"](None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
