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
import tomllib
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
            "tasks = sorted(e['task'] for e in app.conf.beat_schedule.values()); "
            "print(json.dumps([t for t in tasks if t not in app.tasks])); print(json.dumps(tasks))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True,
                          text=True, timeout=60)
    unregistered, tasks = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert unregistered == []  # whatever a schedule names runs in any process (the in-process runner too)
    # One schedule collected from every app's schedule.py, whatever the environment.
    for task in ("claims.tasks.expire_leases", "claims.tasks.allocate_pending", "gangs.tasks.sweep_gangs",
                 "queues.tasks.preempt", "inventory.tasks.sweep_stale_clusters"):
        assert task in tasks, tasks
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
    from inventory.demo import DEMO_LABEL
    from inventory.models import Cluster
    from kube.management.commands.serve import Command

    settings.DEMO_FLEET, settings.DEMO_FLEET_NODES = False, 4
    settings.CELERY_BEAT_SCHEDULE = dict(settings.CELERY_BEAT_SCHEDULE)  # restored after the test
    assert DEMO_TASK not in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    command = Command()
    command._start_demo()
    assert settings.DEMO_FLEET is True
    assert DEMO_TASK in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert Cluster.objects.filter(labels__contains={DEMO_LABEL: "true"}).exists()


# ------------------------------------------------------------------------------------ commands agree

def _manage_py_invocations() -> list[tuple[str, list[str]]]:
    """Every `manage.py <command> <args>` the docs and deployment files tell someone (or something) to run."""
    found = []
    texts = [ROOT / "README.md", ROOT / "Dockerfile", ROOT / "Makefile", ROOT / "docker-compose.yml",
             *sorted((ROOT / "deploy").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*.yaml"))]
    for path in texts:
        text = re.sub(r"\$\(HTTPS_PORT\)", "8443", re.sub(r"\$\((PORT)\)", "8000", path.read_text()))
        for match in re.finditer(r"manage\.py\s+([^|&;#)<>`\"'\n]*)", text):
            words = shlex.split(match.group(1))
            if words:
                found.append((f"{path.relative_to(ROOT)}", words))
    for name in compose()["services"]:
        words = service_command(name) if "command" in compose()["services"][name] else []
        if "manage.py" in words:
            found.append((f"docker-compose.yml:{name}", words[words.index("manage.py") + 1:]))
    return found


def test_every_manage_py_command_in_docs_and_deployment_files_exists_and_accepts_its_options():
    from django.core.management import get_commands, load_command_class

    invocations = _manage_py_invocations()
    names = {words[0] for _, words in invocations}
    assert {"migrate", "collectstatic", "serve", "create_token"} <= names, names
    commands = get_commands()
    for where, (name, *args) in invocations:
        assert name in commands, f"{where}: manage.py {name} does not exist"
        if args:  # (prose also names a command alone: "Tokens (`manage.py create_token`): ...")
            parser = load_command_class(commands[name], name).create_parser("manage.py", name)
            parser.parse_args(args)  # CommandError on an unknown option or a bad value


def test_web_server_runs_with_gunicorn_conf_py_everywhere():
    readme = [shlex.split(line.split("&")[0].split("#")[0]) for line in running_for_real().splitlines()
              if "gunicorn " in line]
    assert readme, "no gunicorn command in Running for real"
    for command in [*readme, service_command("web")]:
        assert Path(command[0]).name == "gunicorn", command
        assert command[1:3] == ["-c", "gunicorn.conf.py"] and "draservice.wsgi:application" in command, command
    # The image's CMD is exactly what compose runs for web (compose spells it out).
    dockerfile_cmd = json.loads(re.search(r"^CMD (.+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE).group(1))
    assert dockerfile_cmd == service_command("web")
    assert "--bind" in dockerfile_cmd and dockerfile_cmd[dockerfile_cmd.index("--bind") + 1].endswith(":8000")
    assert "EXPOSE 8000" in (ROOT / "Dockerfile").read_text()
    assert any(p.endswith(":8000") for p in compose()["services"]["web"]["ports"])


def test_gunicorn_conf_py_loads_and_keeps_connections_longer_than_proxies_do():
    done = subprocess.run([str(Path(sys.executable).with_name("gunicorn")), "--check-config", "-c",
                           "gunicorn.conf.py", "draservice.wsgi:application"], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    conf = gunicorn_config()
    assert conf["worker_class"] == "gthread" and conf["keepalive"] > 60  # > a load balancer's 60 s idle timeout
    assert conf["max_requests"] == 0
    assert conf["timeout"] >= 60
    grace = compose()["services"]["web"]["stop_grace_period"]
    assert int(grace.rstrip("s")) > conf["graceful_timeout"], (grace, conf["graceful_timeout"])


def test_celery_commands_name_the_project_app():
    from celery import Celery

    from draservice.celery import app

    assert isinstance(app, Celery)
    for name in ("worker", "beat"):
        command = service_command(name)
        assert command[:4] == ["celery", "-A", "draservice", name], command
    code = running_for_real()
    assert ".venv/bin/celery -A draservice worker" in code and ".venv/bin/celery -A draservice beat" in code


def test_webhooks_have_a_worker_of_their_own_everywhere(settings):
    """Deliveries go to NOTIFY_QUEUE only: compose and the README start a worker reading it (and the allocation
    worker does not), with the image, health check style and node name the ping addresses."""
    notify = compose()["services"]["notify-worker"]
    command = service_command("notify-worker")
    assert command[:4] == ["celery", "-A", "draservice", "worker"]
    assert command[command.index("-Q") + 1] == settings.NOTIFY_QUEUE == "notify"
    assert "-Q" not in service_command("worker")
    node = command[command.index("-n") + 1].split("@")[0]
    assert f"-d {node}@$$HOSTNAME" in notify["healthcheck"]["test"][1]
    assert notify["healthcheck"]["test"][1].replace(node, "celery") == \
        compose()["services"]["worker"]["healthcheck"]["test"][1]
    line = next(x for x in running_for_real().splitlines() if "-Q" in x)
    assert line.startswith(".venv/bin/celery -A draservice worker -Q notify ") and "-n notify@%h" in line
    from draservice.beat import collect

    entry = collect()["draservice-deliver-webhooks"]
    assert entry["options"]["queue"] == settings.NOTIFY_QUEUE  # beat's sweep goes to the notify worker too


def test_replays_have_a_worker_of_their_own_everywhere(settings):
    """Replays go to REPLAY_QUEUE only: compose and the README start a worker reading it; beat's sweep goes there."""
    replay = compose()["services"]["replay-worker"]
    command = service_command("replay-worker")
    assert command[:4] == ["celery", "-A", "draservice", "worker"]
    assert command[command.index("-Q") + 1] == settings.REPLAY_QUEUE == "replay"
    node = command[command.index("-n") + 1].split("@")[0]
    assert f"-d {node}@$$HOSTNAME" in replay["healthcheck"]["test"][1]
    assert any(x.startswith(".venv/bin/celery -A draservice worker -Q replay ") and "-n replay@%h" in x
               for x in running_for_real().splitlines())
    from draservice.beat import collect

    assert collect()["scheduler-replays"]["options"]["queue"] == settings.REPLAY_QUEUE


def test_health_checks_use_what_the_image_has():
    from django.urls import resolve

    dockerfile = (ROOT / "Dockerfile").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    web = compose()["services"]["web"]["healthcheck"]["test"]
    assert web[:2] == ["CMD", "curl"] and re.search(r"apt-get install [^&]*\bcurl\b", dockerfile)
    resolve(web[-1].split("8000", 1)[1])  # /readyz is a URL of the service
    worker = compose()["services"]["worker"]["healthcheck"]["test"]
    assert "celery -A draservice inspect ping" in worker[1] and any(d.startswith("celery") for d in deps)
    beat = compose()["services"]["beat"]
    assert beat["healthcheck"]["test"][1].split()[2] == service_command("beat")[-1]  # the schedule file it writes
