"""The deployment files agree with each other and with the code, as far as that can be checked without Docker:
docker-compose.yml, the Dockerfile, the README's "Running for real", the Makefile and deploy/ run commands that
exist, with options they accept, and the same gunicorn configuration; health checks use what the image has.
And the demo fleet stays out of every production path: only `make run` (`serve --demo`) asks for it.
"""
from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_TASK = "inventory.tasks.refresh_demo_clusters"


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def service_command(name: str) -> list[str]:
    command = compose()["services"][name].get("command")
    if command is None:  # the image's CMD
        return json.loads(re.search(r"^CMD (.+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE).group(1))
    return command if isinstance(command, list) else shlex.split(command)


def running_for_real() -> str:
    """The shell code of the README's "Running for real" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running for real", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```sh\n(.*?)```", section, re.DOTALL))


def gunicorn_config() -> dict:
    return runpy.run_path(str(ROOT / "gunicorn.conf.py"))


# ------------------------------------------------------------------------------------ the demo fleet

def test_no_compose_service_loads_or_keeps_the_demo_fleet():
    services = compose()["services"]
    for name, service in services.items():
        command = " ".join(service_command(name)) if "command" in service or name == "web" else ""
        assert "load_demo_fleet" not in command and "--demo" not in command, (name, command)
        env = {**compose()["x-app"]["environment"], **(service.get("environment") or {})}
        assert str(env.get("DEMO_FLEET", "false")).lower() in ("false", "0", ""), name
    assert service_command("migrate") == ["python", "manage.py", "migrate", "--noinput"]


def test_running_for_real_does_not_load_the_demo_fleet():
    code = running_for_real()
    assert "manage.py migrate" in code and "load_demo_fleet" not in code and "--demo" not in code


def test_make_run_is_where_the_demo_is_asked_for():
    recipe = (ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "manage.py serve --demo" in recipe


@pytest.mark.parametrize("demo_fleet, expected", [(None, False), ("true", True)])
def test_beat_schedule_has_the_demo_heartbeat_only_when_asked(demo_fleet, expected):
    # What `celery -A draservice beat` loads, in a fresh process with the environment of a deployment.
    env = {k: v for k, v in os.environ.items() if k != "DEMO_FLEET"}
    if demo_fleet:
        env["DEMO_FLEET"] = demo_fleet
    code = ("import json, django; django.setup(); from draservice.celery import app; "
            "print(json.dumps(sorted(e['task'] for e in app.conf.beat_schedule.values())))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True,
                          text=True, timeout=60)
    tasks = json.loads(done.stdout.strip().splitlines()[-1])
    assert tasks  # the other apps' entries are there either way
    assert (DEMO_TASK in tasks) is expected, tasks


def _demo_cluster():
    from django.utils import timezone

    from inventory.demo import DEMO_LABEL
    from inventory.models import Cluster
    from inventory.services import clusters

    cluster, _ = clusters.create_cluster(name="demo-x", labels={DEMO_LABEL: "true"}, with_token=False)
    long_ago = timezone.now() - timedelta(hours=1)
    Cluster.objects.filter(pk=cluster.pk).update(last_heartbeat_at=long_ago)
    return cluster.pk, long_ago


def test_the_demo_heartbeat_task_does_nothing_outside_the_demo(db, settings):
    from inventory.models import Cluster
    from inventory.tasks import refresh_demo_clusters

    settings.DEMO_FLEET = False
    pk, long_ago = _demo_cluster()
    assert refresh_demo_clusters() == 0  # e.g. from a beat schedule file an older version persisted
    assert Cluster.objects.get(pk=pk).last_heartbeat_at == long_ago
    settings.DEMO_FLEET = True
    assert refresh_demo_clusters() == 1
    assert Cluster.objects.get(pk=pk).last_heartbeat_at > long_ago


def test_serve_demo_loads_the_fleet_and_schedules_its_heartbeat(db, settings):
    from claims.management.commands.serve import Command
    from inventory.demo import DEMO_LABEL
    from inventory.models import Cluster

    settings.DEMO_FLEET, settings.DEMO_FLEET_NODES = False, 4
    settings.CELERY_BEAT_SCHEDULE = dict(settings.CELERY_BEAT_SCHEDULE)  # restored after the test
    assert DEMO_TASK not in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    command = Command()
    command._start_demo()
    assert settings.DEMO_FLEET is True
    assert DEMO_TASK in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert Cluster.objects.filter(labels__contains={DEMO_LABEL: "true"}).exists()
