"""Watches in their own process (``kube.watch_server``), through ``manage.py serve``'s public port as kubectl
uses it: one tenant's watches leave other tenants' requests fast, the per-token cap answers 429 with
Retry-After, no event of another tenant's namespace reaches a watch (tombstones included), and ``kubectl get
-w`` and ``kubectl wait`` are answered by the watch process."""
from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import threading
import time
import urllib.parse

import pytest
import yaml

from tests.kube.test_kubectl import NS as KUBECTL_NS
from tests.kube.test_kubectl import _wait_for_event, _watch_events, claim_yaml

NS = "watch-server"
CLAIMS = "/k8s/apis/resource.k8s.io/v1"


def _claim(name: str, namespace: str = NS) -> str:
    return claim_yaml(name).replace(f"namespace: {KUBECTL_NS}", f"namespace: {namespace}")


def _token(kubeconfig) -> str:
    return yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]


def _connect(base: str, timeout: float = 10) -> http.client.HTTPSConnection:
    url = urllib.parse.urlsplit(base)
    return http.client.HTTPSConnection(url.hostname, url.port, timeout=timeout,
                                       context=ssl._create_unverified_context())


def _get(base: str, path: str, token: str | None = None) -> tuple[int, dict, dict]:
    conn = _connect(base)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _open_watch(base: str, path: str, token: str) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
    """A watch with its response headers in (the server flushes them at once)."""
    conn = _connect(base)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    return conn, conn.getresponse()


def _watchz(kube_service) -> dict:
    return _get(kube_service.base.removesuffix("/k8s"), "/watchz")[2]


@pytest.fixture(scope="module")
def tenants(kube_service):
    """(team-a's token, team-b's token), team-b's made here."""
    team_b = kube_service.manage("create_token", "--namespace", "team-b").strip().splitlines()[-1]
    return _token(kube_service.team_kubeconfig), team_b


def test_one_tenants_watches_leave_another_tenants_list_fast_and_the_cap_answers_429(kube_service, tenants):
    team_a, team_b = tenants
    root = kube_service.base.removesuffix("/k8s")
    cap = 50  # KUBE_MAX_WATCHES_PER_TOKEN's default
    before = _watchz(kube_service)
    watches = []
    try:
        for _ in range(cap):
            conn, response = _open_watch(root, f"{CLAIMS}/namespaces/team-a/resourceclaims?watch=1", team_a)
            assert response.status == 200, response.read()
            watches.append(conn)
        assert _watchz(kube_service)["watches"] == before["watches"] + cap
        # Another tenant meanwhile: its plain list (gunicorn) and its own watch (the watch server) are fast.
        started = time.monotonic()
        status, _, body = _get(root, f"{CLAIMS}/namespaces/team-b/resourceclaims", team_b)
        assert status == 200 and body["kind"] == "ResourceClaimList"
        assert time.monotonic() - started < 1.0
        started = time.monotonic()
        conn, response = _open_watch(root, f"{CLAIMS}/namespaces/team-b/resourceclaims?watch=true", team_b)
        assert response.status == 200 and time.monotonic() - started < 1.0
        watches.append(conn)
        # One more of team-a's: refused as kube-apiserver refuses past max-in-flight.
        status, headers, body = _get(root, f"{CLAIMS}/namespaces/team-a/resourceclaims?watch=1", team_a)
        assert status == 429
        assert headers["retry-after"] == "5"
        assert (body["kind"], body["reason"], body["code"], body["details"]) == (
            "Status", "TooManyRequests", 429, {"retryAfterSeconds": 5})
        assert "KUBE_MAX_WATCHES_PER_TOKEN" in body["message"]
    finally:
        for conn in watches:
            conn.close()
    deadline = time.monotonic() + 5
    while _watchz(kube_service)["watches"] > before["watches"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _watchz(kube_service)["watches"] == before["watches"]  # closed watches are counted out at once


def _events(response: http.client.HTTPResponse) -> list[dict]:
    return [json.loads(line) for line in response.read().splitlines() if line.strip()]


def test_no_event_of_another_tenant_reaches_a_watch_across_namespaces(kube_service, kubectl, tenants):
    team_a, _ = tenants
    root = kube_service.base.removesuffix("/k8s")
    kubectl("apply", "-f", "-", stdin=_claim("ours", "team-a"))
    kubectl("apply", "-f", "-", stdin=_claim("theirs", "team-b"))
    started = time.monotonic()
    conn, response = _open_watch(root, f"{CLAIMS}/resourceclaims?watch=1&timeoutSeconds=3", team_a)
    try:
        assert response.status == 200
        time.sleep(0.5)  # the watch is past its initial events: what follows comes from the change log
        kubectl("delete", "resourceclaim", "theirs", "-n", "team-b")
        kubectl("delete", "resourceclaim", "ours", "-n", "team-a")
        events = _events(response)  # until the server ends the stream at timeoutSeconds
    finally:
        conn.close()
    assert 3 <= time.monotonic() - started < 6  # timeoutSeconds is honoured
    seen = [(e["type"], e["object"]["metadata"]["namespace"], e["object"]["metadata"]["name"]) for e in events]
    assert ("ADDED", "team-a", "ours") in seen and ("DELETED", "team-a", "ours") in seen, seen
    assert all(namespace == "team-a" for _, namespace, _ in seen), seen


def test_kubectl_get_w_and_wait_are_served_by_the_watch_process(kubectl, kube_service):
    kubectl("apply", "-f", "-", stdin=_claim("early"))
    kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/early", "-n", NS, "--timeout=60s")
    served = _watchz(kube_service)["served"]
    started = time.monotonic()
    kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/early", "-n", NS, "--timeout=60s")
    assert time.monotonic() - started < 1.0  # already met: the initial events answer it
    watcher = subprocess.Popen(["kubectl", "--kubeconfig", str(kube_service.kubeconfig), "get", "resourceclaims",
                                "-n", NS, "-w", "--output-watch-events", "-o", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: list = []
    threading.Thread(target=_watch_events, args=(watcher, events), daemon=True).start()
    try:
        _wait_for_event(events, "early")
        time.sleep(0.5)  # kubectl's watch (after its list) is open
        kubectl("apply", "-f", "-", stdin=_claim("late"))
        _wait_for_event(events, "late")  # its ADDED (changes of a row gone by the next poll show as DELETED)
        kubectl("wait", "--for=jsonpath={.status.allocation}", "resourceclaim/late", "-n", NS, "--timeout=60s")
        kubectl("delete", "resourceclaim", "late", "-n", NS)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e["type"] == "DELETED" for e in events):
            time.sleep(0.1)
    finally:
        watcher.terminate()
        watcher.wait(10)
    late = [(e["type"], bool(e["object"].get("spec", {}).get("devices")))
            for e in events if e["object"]["metadata"]["name"] == "late"]
    assert late[0][0] == "ADDED" and late[-1] == ("DELETED", True), late  # DELETED carries the last state
    assert "MODIFIED" in [t for t, _ in late] or len(late) == 2, late
    assert _watchz(kube_service)["served"] >= served + 3  # the two waits' watches and get -w's
    kubectl("delete", "resourceclaim", "early", "-n", NS)
