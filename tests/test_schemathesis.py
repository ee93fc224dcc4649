"""schemathesis against the live service: the OpenAPI schema is true and no input gets a 500 (issue 12).

The service runs as it does in production, minus the broker: ``manage.py serve`` (gunicorn, threaded, with
its in-process allocation runner) on a PostgreSQL database of its own, seeded with a small fleet, a
namespace and claim, template, consumer and gang in it, so that path parameters resolve (schemathesis
draws them from those names most of the time and invents the rest). schemathesis then runs twice over
``/api/schema/``, once with an admin token and once with a namespace token, with a fixed seed, the checks
``not_a_server_error`` and ``response_schema_conformance``, and a budget of examples per operation (``DEFAULT``
in `make test`, ``LONG`` in `make test-long`); the test asserts no failure of either check and the budget's
minimum of requests in all, and prints the figures.

Alone: ``DATABASE_URL=... pytest tests/test_schemathesis.py -s``; ``ST_KEEP=1`` keeps the reports in
``var/schemathesis``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from tests.live import admin_sql, database_url, free_port, stop_service, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.live]  # its services are subprocesses on a database of its own

ROOT = Path(__file__).resolve().parent.parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
SEED = 12012


@dataclass(frozen=True)
class Budget:
    """One run per token kind. ``max_examples`` bounds each operation's cases per phase; ``max_seconds``, when
    set, makes the fuzzing and stateful phases draw cases until that time is spent instead (schemathesis' own
    rule), so only the long budget sets it: the default one sends the same bounded set of cases each time (the
    seed is fixed) whatever the machine's load, and the subprocess' timeout only stops a run that hangs.
    ``min_requests`` over both runs is what a working run always reaches and a broken one (a dead service, a
    schema that selects nothing) never."""
    max_examples: int
    min_requests: int
    phases: str
    max_seconds: int | None = None
    hang_seconds: int = 600


# `make test`: every operation of both token kinds gets its schema's examples and 9 generated cases (positive
# and negative); about 2,300 requests. The coverage phase (some 4,000 boundary cases a token) is the long one's.
DEFAULT = Budget(max_examples=9, min_requests=2_000, phases="examples,fuzzing")
# `make test-long`: every phase, fuzzing and stateful sequences for ten minutes a token.
LONG = Budget(max_examples=150, min_requests=10_000, phases="examples,coverage,fuzzing,stateful", max_seconds=600,
              hang_seconds=1_800)
NAMESPACE, CLUSTER = "team-a", "c1"
NAMES = {"claim": "claim-1", "template": "h100x1", "consumer": "consumer-1", "gang": "gang-1"}

SEED_SCRIPT = """
import json, django
django.setup()
from claims.services import claims, consumers, templates
from gangs.services import gangs
from draservice.models import APIToken
from inventory.models import Device, Node, Pool, ResourceSlice
from draservice.tokens import issue_token
from tests.claims import fleet
from tests.gangs.fleet import gang_body, template_body
N = json.loads({names!r})
fleet.load_fleet({{{cluster!r}: [("h100", 1), ("a100-mig", 1)]}})
claims.create_claims({ns!r}, [fleet.gpu_claim(N["claim"])])
templates.create_template({ns!r}, template_body(N["template"], count=1))
consumers.create_consumer({ns!r}, {{"apiVersion": "draservice.io/v1alpha1", "kind": "Consumer",
    "metadata": {{"name": N["consumer"]}}, "spec": {{"resourceClaims": [{{"name": "gpu",
    "resourceClaimName": N["claim"]}}]}}}})
body = gang_body(N["gang"], 1, template=N["template"], required=None, preferred=None)
gangs.create_gang({ns!r}, body)
_, admin = issue_token(kind=APIToken.ADMIN, name="schemathesis admin")
_, team = issue_token(kind=APIToken.NAMESPACE, namespaces=[{ns!r}], name="schemathesis namespace")
print(json.dumps({{"admin": admin, "namespace": team,
    "ids": sorted({{m.objects.order_by("id").first().id for m in (Device, Node, Pool, ResourceSlice)}}),
    "slice": ResourceSlice.objects.order_by("id").first().name, "node": Node.objects.order_by("id").first().name}}))
"""


@pytest.fixture(scope="module")
def live_service(tmp_path_factory):
    """``(base URL, seed facts, service log)`` of a seeded service on a database of its own."""
    name = f"{settings.DATABASES['default']['NAME']}_st_{os.getpid()}"
    admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin_sql(f'CREATE DATABASE "{name}"')
    log = tmp_path_factory.mktemp("schemathesis") / "service.log"
    env = {**os.environ, "DATABASE_URL": database_url(name), "CELERY_BROKER_URL": "", "DEBUG": "false",
           "DJANGO_SETTINGS_MODULE": "draservice.settings", "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"}
    proc = None
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                       check=True)
        script = SEED_SCRIPT.format(names=json.dumps(NAMES), cluster=CLUSTER, ns=NAMESPACE)
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, capture_output=True,
                             text=True).stdout
        facts = json.loads(out.strip().splitlines()[-1])
        port = free_port()
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)],
                                    cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/livez", proc)
        yield base, facts, log
    finally:
        stop_service(proc)
        admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _config(facts: dict, budget: Budget) -> str:
    """schemathesis.toml: known names for path parameters (with a chance of invented ones), the checks."""
    dictionaries = {
        "namespaces": [NAMESPACE], "clusters": [CLUSTER], "names": list(NAMES.values()) + ["gpu.nvidia.com"],
        "ids": facts["ids"], "slices": [facts["slice"]], "nodes": [facts["node"]],
        # A long poll holds a server thread for up to 2 minutes after schemathesis gave up on it: short ones.
        "waits": ["0", "500ms", "1s"],
    }
    bindings = {"path.namespace": "namespaces", "path.cluster": "clusters", "path.name": "names",
                "path.id": "ids", "path.slice_name": "slices", "path.node_name": "nodes", "query.wait": "waits"}
    # One worker: with several, hypothesis describes filter lambdas with ast.parse in threads, which CPython
    # 3.11 does not survive ("AST constructor recursion depth mismatch", a schemathesis-side error).
    lines = [f"seed = {SEED}", *([f"max-time = {budget.max_seconds}"] if budget.max_seconds else []), "workers = 1", "",
             "[generation]", "deterministic = false", "", "[checks]", "enabled = false",
             "not_a_server_error.enabled = true", "response_schema_conformance.enabled = true", "",
             "[dictionaries]"]
    lines += [f"{key} = {{ values = {json.dumps(values)} }}" for key, values in dictionaries.items()]
    lines += ["", "[parameters]"]
    lines += [f'"{key}" = {{ dictionary = "{value}", probability = {1.0 if key == "query.wait" else 0.8} }}'
              for key, value in bindings.items()]
    return "\n".join(lines) + "\n"


def _run(base: str, token: str, label: str, facts: dict, workdir: Path, budget: Budget) -> dict:
    config = workdir / f"{label}.toml"
    config.write_text(_config(facts, budget))
    report = workdir / f"{label}.ndjson"
    cmd = [str(SCHEMATHESIS), "--config-file", str(config), "run", f"{base}/api/schema/", "--url", base,
           "-H", f"Authorization: Bearer {token}", "--report", "ndjson", "--report-ndjson-path", str(report),
           "--max-examples", str(budget.max_examples), "--phases", budget.phases, "--request-timeout", "30",
           "--no-color", "--output-truncate", "true"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=budget.hang_seconds)
    return {"label": label, "seconds": time.monotonic() - started, "exit": proc.returncode,
            "output": proc.stdout + proc.stderr, **_tally(report)}


def _tally(report: Path) -> dict:
    """Requests sent, check failures (deduplicated), transport errors, the schema's operations and those sent
    at least one request, from schemathesis' ndjson events."""
    requests, failures, errors, operations, exercised = 0, {}, [], 0, set()
    phases: dict[str, int] = {}
    for line in report.read_text().splitlines():
        event = json.loads(line)
        if "LoadingFinished" in event:
            operations = event["LoadingFinished"]["statistic"]["operations"]["selected"]
        if "NonFatalError" in event:
            error = event["NonFatalError"]
            errors.append(f"{error.get('label')}: {error['value']['type']}: {error['value']['message'][:300]}")
        scenario = event.get("ScenarioFinished") or {}
        recorder = scenario.get("recorder") or {}
        requests += len(recorder.get("interactions") or {})
        if scenario:
            phases[scenario["phase"]] = phases.get(scenario["phase"], 0) + len(recorder.get("interactions") or {})
        if recorder.get("interactions") and scenario["phase"] != "stateful":  # stateful: one scenario in all
            exercised.add(recorder["label"])
        for checks in (recorder.get("checks") or {}).values():
            for check in checks:
                if check["status"] == "failure":
                    failure = check["failure_info"]["failure"]
                    key = f"{failure['operation']}: {failure['title']}: {failure['message'][:600]}"
                    failures[key] = failures.get(key, 0) + 1
    return {"requests": requests, "failures": failures, "errors": errors, "operations": operations,
            "exercised": len(exercised), "phases": phases}


def test_schemathesis_finds_no_server_error_and_no_schema_violation(live_service, tmp_path):
    _fuzz(live_service, tmp_path, DEFAULT)


@pytest.mark.long
def test_schemathesis_long_budget(live_service, tmp_path):
    _fuzz(live_service, tmp_path, LONG)


def _fuzz(live_service, tmp_path: Path, budget: Budget) -> None:
    base, facts, log = live_service
    # The namespace token first: the admin run may delete the seeded objects (and push an empty inventory).
    runs = [_run(base, facts["namespace"], "namespace", facts, tmp_path, budget),
            _run(base, facts["admin"], "admin", facts, tmp_path, budget)]
    if os.environ.get("ST_KEEP"):
        keep = ROOT / "var" / "schemathesis"
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(tmp_path, keep)
        shutil.copy(log, keep / "service.log")
    total = sum(r["requests"] for r in runs)
    for r in runs:
        print(f"schemathesis ({r['label']} token): {r['requests']} requests to {r['exercised']} of "
              f"{r['operations']} operations in {r['seconds']:.0f} s, "
              f"{sum(r['failures'].values())} check failures, {len(r['errors'])} errors, exit {r['exit']}; "
              f"by phase {r['phases']}")
    print(f"schemathesis: {total} requests in all, seed {SEED}, {budget}")
    for r in runs:
        assert not r["failures"], f"{r['label']}:\n" + "\n".join(r["failures"])
        # A request without an answer (a timeout, a reset) is as bad as a 500.
        assert not r["errors"], f"{r['label']}: {r['errors']}"
        # The time budget must not end a run before its coverage phase has sent every operation something.
        assert r["operations"] and r["exercised"] == r["operations"], (r["label"], r["exercised"], r["operations"])
    assert total >= budget.min_requests, [r["output"][-2000:] for r in runs]


# ------------------------------------------------------------------------------------ keep-alive connections

def _http_response(sock) -> bytes:
    """The status line of one response read off ``sock`` (Content-Length framed, as all of ours are)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection without a response"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0]


def test_an_answer_that_ignores_the_body_does_not_stall_the_connection(live_service):
    """A 405 (the view never reads the body) used to be sent as soon as the headers were in; gunicorn then
    discarded the body while the client's next request arrived, took both into its buffer, and the next
    request was never answered (schemathesis' read timeouts, the issue's keep-alive resets)."""
    base, facts, _ = live_service
    host, port = base.removeprefix("http://").split(":")
    auth = f"Host: {host}\r\nAuthorization: Bearer {facts['admin']}\r\n"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"PUT /api/v1/simulate HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"
                     "Content-Length: 2\r\n\r\n".encode())
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            sock.recv(1)  # no answer before the body is in
        sock.settimeout(10)
        sock.sendall(b"{}")
        assert _http_response(sock).endswith(b"405 Method Not Allowed")
        sock.sendall(f"GET /api/v1/namespaces HTTP/1.1\r\n{auth}\r\n".encode())
        assert _http_response(sock).endswith(b"200 OK")


def test_keep_alive_connections_under_16_threads_get_every_answer(live_service):
    """2,000 requests on 16 keep-alive connections, a third of them answered without reading their body."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor

    base, facts, _ = live_service
    host, port = base.removeprefix("http://").split(":")
    headers = {"Authorization": f"Bearer {facts['admin']}", "Content-Type": "application/json"}
    shapes = [("GET", "/api/v1/namespaces", None, 200), ("PUT", "/api/v1/simulate", b'{"a": 1}', 405),
              ("POST", "/api/v1/cel/validate", b'{"expression": "true"}', 200)]

    def client(i: int) -> list:
        conn, failures = http.client.HTTPConnection(host, int(port), timeout=20), []
        for n in range(125):
            method, path, body, expected = shapes[(i + n) % len(shapes)]
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != expected:
                    failures.append((method, path, response.status))
            except (OSError, http.client.HTTPException) as exc:
                failures.append((method, path, repr(exc)))
                conn.close()
        conn.close()
        return failures

    with ThreadPoolExecutor(16) as pool:
        failures = [f for result in pool.map(client, range(16)) for f in result]
    assert not failures, failures[:10]
