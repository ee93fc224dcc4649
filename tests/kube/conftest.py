"""The live service for the Kubernetes front door's end-to-end tests: ``manage.py serve --demo --tls`` (gunicorn,
the in-process allocation worker, a small demo fleet kept fresh) on a PostgreSQL database of its own, and a
kubeconfig from ``create_token --kubeconfig`` (kubectl sends its token only over HTTPS)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from tests.live import admin_sql, database_url, free_port, stop_service, wait_for

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@dataclass
class KubeService:
    base: str  # https://127.0.0.1:port/k8s
    kubeconfig: Path  # an admin's
    team_kubeconfig: Path  # a namespace token's (team-a)
    env: dict
    log: Path

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, check=True,
                              capture_output=True, text=True).stdout


@pytest.fixture(scope="session")
def kube_service(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the test service's TLS certificate")
    name = f"{settings.DATABASES['default']['NAME']}_kube_{os.getpid()}"
    admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin_sql(f'CREATE DATABASE "{name}"')
    work = tmp_path_factory.mktemp("kube")
    log = work / "service.log"
    env = {**os.environ, "DATABASE_URL": database_url(name), "CELERY_BROKER_URL": "", "DEBUG": "false",
           "DJANGO_SETTINGS_MODULE": "draservice.settings", "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING",
           "DRASERVICE_VAR_DIR": str(work), "DEMO_FLEET_NODES": "12", "KUBE_WATCH_MAX_SECONDS": "60"}
    proc = None
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                       check=True)
        port = free_port()
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--demo", "--tls", "--port", str(port)],
                                    cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(f"https://127.0.0.1:{port}/livez", proc, 120)
        base = f"https://127.0.0.1:{port}/k8s"
        service = KubeService(base, work / "admin.kubeconfig", work / "team.kubeconfig", env, log)
        service.kubeconfig.write_text(service.manage("create_token", "--admin", "--kubeconfig", base))
        service.team_kubeconfig.write_text(service.manage("create_token", "--namespace", "team-a",
                                                          "--kubeconfig", base))
        yield service
    finally:
        stop_service(proc)
        admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def kubectl(kube_service):
    """``kubectl("get", "resourceclaims", ...)`` -> CompletedProcess, as the admin (``as_team=True``: team-a's
    namespace token); skips where kubectl is absent."""
    if not os.path.exists(KUBECTL):
        pytest.skip(f"kubectl is not installed at {KUBECTL}")

    def run(*args: str, stdin: str | None = None, as_team: bool = False, check: bool = True, timeout: float = 60):
        config = kube_service.team_kubeconfig if as_team else kube_service.kubeconfig
        result = subprocess.run([KUBECTL, "--kubeconfig", str(config), *args], input=stdin, text=True,
                                capture_output=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result
    return run
