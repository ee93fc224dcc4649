"""The official Python ``kubernetes`` client against the live /k8s door, in two versions: the one the project
pins (this venv's) and the newest, 37.x (installed apart, under ``.venv/kubernetes37`` by ``make venv``; here
if it is missing), which sends no Content-Type on create. Each creates, lists, watches, patches and deletes a
claim in a process of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEWEST = ROOT / ".venv" / "kubernetes37"

SCRIPT = r'''
import json, sys
import kubernetes
from kubernetes import client, config, watch

api_client = config.new_client_from_config(config_file=sys.argv[1])
v1 = client.ResourceV1Api(api_client)
ns, name = sys.argv[2], sys.argv[3]
body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"client": "python"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
created = v1.create_namespaced_resource_claim(ns, body)
listed = v1.list_namespaced_resource_claim(ns, label_selector="client=python")
seen = None
# The client's own bug: its watch names the item model after the list's (V1ResourceClaim), which it calls
# ResourceV1ResourceClaim; so say it.
claims = watch.Watch(return_type="ResourceV1ResourceClaim")
for event in claims.stream(v1.list_namespaced_resource_claim, ns, field_selector=f"metadata.name={name}",
                           timeout_seconds=5):
    seen = event["type"], event["object"].metadata.name
    break
patched = v1.patch_namespaced_resource_claim(name, ns, {"metadata": {"labels": {"patched": "yes"}}})
deleted = v1.delete_namespaced_resource_claim(name, ns)
try:
    v1.read_namespaced_resource_claim(name, ns)
    gone = False
except client.ApiException as exc:
    gone = exc.status == 404
print(json.dumps({"version": kubernetes.__version__, "created": created.metadata.name,
                  "listed": [c.metadata.name for c in listed.items], "watched": seen,
                  "patched": patched.metadata.labels, "deleted": deleted.metadata.name, "gone": gone}))
'''


def newest_client() -> Path:
    if not (NEWEST / "kubernetes").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(NEWEST), "kubernetes==37.*"],
                       check=True, capture_output=True, timeout=300)
    return NEWEST


@pytest.mark.parametrize("which", ["pinned", "newest"])
def test_the_official_python_client_creates_lists_watches_patches_deletes(kube_service, which):
    env = {**os.environ}
    if which == "newest":
        env["PYTHONPATH"] = str(newest_client())  # ahead of the venv's own kubernetes and its dependencies
    name = f"from-{which}"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(kube_service.kubeconfig), "python-clients", name],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["version"].startswith("37.") if which == "newest" else out["version"].startswith("35.")
    assert (out["created"], out["listed"], out["deleted"], out["gone"]) == (name, [name], name, True)
    assert out["watched"] == ["ADDED", name]
    assert out["patched"] == {"client": "python", "patched": "yes"}
