"""Fixtures for the agent: a Kubernetes API server on a real socket, and the real client pointed at it
through a kubeconfig file (the same path ``draservice-agent --kubeconfig`` takes)."""
from __future__ import annotations

import copy
import io
import json
import os
import time

import pytest
import yaml
from django.core.management import call_command

from agent.kube import KubeClient
from agent.runner import Agent, Settings
from agent.service import ServiceClient, TokenSource
from tests.agent.kube_api import KubeAPIServer

KUBE_TOKEN = "agent-service-account-token"


@pytest.fixture
def kube_api():
    server = KubeAPIServer(token=KUBE_TOKEN).start()
    yield server
    server.close()


def kube_client_for(server: KubeAPIServer, tmp_path) -> KubeClient:
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server.url}}],
        "users": [{"name": "agent", "user": {"token": KUBE_TOKEN}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "agent"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return KubeClient.from_environment(kubeconfig=str(path))


@pytest.fixture
def kube(kube_api, tmp_path):
    return kube_client_for(kube_api, tmp_path)


@pytest.fixture(scope="session")
def real_slices(shared_dir):
    """Real drivers' ResourceSlices (NVIDIA GPUs and MIG, AMD, Intel, the example driver)."""
    with open(os.path.join(shared_dir, "fixtures", "real-slices.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture
def slices(real_slices):
    return copy.deepcopy(real_slices)


def node(name: str, **labels) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def device_class(name: str, expression: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


GPU_CLASS = device_class("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com' && "
                                           "device.attributes['gpu.nvidia.com'].type == 'gpu'")
MIG_CLASS = device_class("mig.nvidia.com", "device.driver == 'gpu.nvidia.com' && "
                                           "device.attributes['gpu.nvidia.com'].type == 'mig'")

# Fast timings for tests; production defaults are in agent.runner.Settings.
FAST = dict(resync_period=300.0, heartbeat_interval=0.5, watch_timeout=5, batch_delay=0.05,
            claim_poll_interval=0.2, backoff_cap=1.0)


@pytest.fixture(autouse=True)
def _service_urls(settings):
    settings.ROOT_URLCONF = "tests.agent.urls"


@pytest.fixture
def cluster_token(transactional_db):
    """A registered cluster and its agent token, made the way an operator makes them."""
    out = io.StringIO()
    call_command("create_token", "--cluster", "kind-east", "--create-cluster", stdout=out, stderr=io.StringIO())
    return "kind-east", out.getvalue().strip()


@pytest.fixture
def start_agent(kube_api, tmp_path, cluster_token, live_server):
    """Start the real agent against ``kube_api`` and the live service (or ``service_url``)."""
    agents = []

    def start(service_url: str | None = None, **settings) -> Agent:
        name, secret = cluster_token
        service = ServiceClient(service_url or live_server.url, name, TokenSource(token=secret), timeout=10)
        agent = Agent(kube_client_for(kube_api, tmp_path), service, Settings(**{**FAST, **settings}))
        agent.start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()


def wait_for(predicate, timeout=15.0, interval=0.05, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
