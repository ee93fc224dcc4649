"""The deployment files: the manifest is coherent with the agent's own configuration, its RBAC grants
what the agent actually requests, and the agent runs without the service's Django stack (its image
installs only the Kubernetes client and prometheus-client)."""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = os.path.join(ROOT, "deploy", "agent", "agent.yaml")


def manifest() -> dict[str, dict]:
    with open(MANIFEST, encoding="utf-8") as fh:
        return {doc["kind"]: doc for doc in yaml.safe_load_all(fh) if doc}


def cluster_role_allows(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", [])
               for r in rules)


def rbac_misses(requests: list[tuple[str, str, dict]]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the requests needed that the manifest's ClusterRole does not grant.
    Discovery (/version, /apis...) is granted to every authenticated user by Kubernetes' defaults."""
    rules = manifest()["ClusterRole"]["rules"]
    missing = set()
    for method, path, query in requests:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) > 3:
            group, rest = parts[1], parts[3:]
        else:
            continue  # discovery
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        if method == "GET":
            verb = "watch" if query.get("watch") in ("true", "1") else "get" if len(rest) > 1 else "list"
        else:
            verb = {"PUT": "update", "PATCH": "patch", "DELETE": "delete", "POST": "create"}[method]
        if not cluster_role_allows(rules, group, resource, verb):
            missing.add((group, resource, verb))
    return missing


def test_manifest_wires_service_account_secret_and_configuration():
    docs = manifest()
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment"} <= set(docs)
    deployment = docs["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]
    container = pod["containers"][0]
    token_file = next(e["value"] for e in container["env"] if e["name"] == "DRASERVICE_TOKEN_FILE")
    mount = next(m for m in container["volumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "draservice-agent-token"
    # Every ConfigMap key is a variable the agent reads.
    with open(os.path.join(ROOT, "agent", "__main__.py"), encoding="utf-8") as fh:
        read = set(re.findall(r'_env\("([A-Z_]+)"', fh.read()))
    assert set(docs["ConfigMap"]["data"]) <= read, set(docs["ConfigMap"]["data"]) - read
    ports = {p["containerPort"] for p in container["ports"]}
    assert int(docs["ConfigMap"]["data"]["DRASERVICE_METRICS_PORT"]) in ports


def test_the_agent_runs_without_django():
    code = ("import sys, agent.__main__, agent.runner; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery', "
            "'inventory', 'claims', 'dra', 'draservice')); print(bad); sys.exit(1 if bad else 0)")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_image_installs_the_agent_and_its_entry_point():
    with open(os.path.join(ROOT, "deploy", "agent", "Dockerfile"), encoding="utf-8") as fh:
        dockerfile = fh.read()
    assert "COPY agent ./agent" in dockerfile
    assert 'ENTRYPOINT ["draservice-agent"]' in dockerfile
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        pyproject = fh.read()
    # The console script the image runs resolves to a callable that answers --version.
    target = tomllib.loads(pyproject)["project"]["scripts"]["draservice-agent"]
    module, _, attr = target.partition(":")
    main = getattr(importlib.import_module(module), attr)
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    # The image pins the same dependency ranges as the project.
    for dep in re.findall(r'"((?:kubernetes|prometheus-client)[^"]*)"', dockerfile):
        assert f'"{dep}"' in pyproject, dep
