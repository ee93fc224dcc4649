"""Fixtures for the agent: a Kubernetes API server on a real socket, and the real client pointed at it
through a kubeconfig file (the same path ``draservice-agent --kubeconfig`` takes)."""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from agent.kube import KubeClient
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
