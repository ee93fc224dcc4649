"""The service image, without a Docker engine: the files the Dockerfile's COPY lines put in it (honouring
.dockerignore as Docker does) must cover everything pyproject.toml ships and everything the image's commands
need, and the Dockerfile's build step must succeed on exactly those files.

The build test copies that file list into a temporary directory, "installs" it there as `pip install .`
would (setuptools' build_py with pyproject's configuration), then runs ``manage.py collectstatic`` (the
Dockerfile's RUN line) with only that directory, the installed packages and the third-party dependencies
importable - never this checkout (the virtualenv's editable install points at it, so ``python -S`` keeps its
.pth finder out). A package missing from the image then fails here as it failed ``docker build``:
ModuleNotFoundError.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE_DOCKERFILE = ROOT / "Dockerfile"
AGENT_DOCKERFILE = ROOT / "deploy" / "agent" / "Dockerfile"


# ------------------------------------------------------------------------------------ .dockerignore

def _pattern_regex(pattern: str) -> re.Pattern:
    """Docker's pattern syntax (moby/patternmatcher): ``*`` and ``?`` stop at ``/``, ``**`` spans directories."""
    out, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            end = pattern.index("]", i)
            out += pattern[i:end + 1]
            i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(f"^{out}$")


def load_dockerignore(context: Path) -> list[tuple[bool, re.Pattern]]:
    path = context / ".dockerignore"
    rules = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern_regex(pattern)))
    return rules


def ignored(rules, relpath: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    parts = relpath.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for negated, regex in rules:
        if excluded == (not negated):
            continue  # this rule could not change the outcome
        if any(regex.match(c) for c in candidates):
            excluded = not negated
    return excluded


def context_files(context: Path) -> list[str]:
    """Every file the build context sends (relative POSIX paths), after .dockerignore."""
    rules = load_dockerignore(context)
    out = []
    for dirpath, dirnames, filenames in os.walk(context):
        rel_dir = os.path.relpath(dirpath, context)
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            if not ignored(rules, rel):
                out.append(rel)
    return sorted(out)


# ------------------------------------------------------------------------------------ Dockerfile

def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _copy_args(rest: str) -> tuple[list[str], str]:
    args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    if any(a.startswith("--from") for a in args):
        raise AssertionError("COPY --from (multi-stage) is not modelled by this test: extend it")
    args = [a for a in args if not a.startswith("--")]  # --chown, --chmod, --link
    return args[:-1], args[-1]


def image_files(dockerfile: Path, context: Path = ROOT) -> dict[str, str]:
    """{absolute path in the image: context path} for every file the COPY lines put in the image."""
    files = context_files(context)
    workdir, image = "/", {}
    for word, rest in instructions(dockerfile):
        assert word != "ADD", "use COPY (this test models COPY only)"
        if word == "FROM":
            workdir, image = "/", {}
        elif word == "WORKDIR":
            workdir = str(PurePosixPath(workdir, rest))
        elif word == "COPY":
            sources, dest = _copy_args(rest)
            dest_dir = dest.endswith("/") or dest in (".", "./") or len(sources) > 1
            dest = str(PurePosixPath(workdir, dest))
            for src in sources:
                src = os.path.normpath(src).lstrip("/")
                for rel in files:
                    if src == "." or rel.startswith(src + "/"):       # a directory: its contents
                        inner = rel if src == "." else rel[len(src) + 1:]
                        image[str(PurePosixPath(dest, inner))] = rel
                    elif rel == src or fnmatch.fnmatchcase(rel, src) and rel.count("/") == src.count("/"):
                        target = PurePosixPath(dest, PurePosixPath(rel).name) if dest_dir else PurePosixPath(dest)
                        image[str(target)] = rel
    return image


def build_dir(dockerfile: Path) -> str:
    """The WORKDIR in effect where the Dockerfile runs `pip install ... .` (the project's source tree)."""
    workdir = "/"
    for word, rest in instructions(dockerfile):
        if word == "WORKDIR":
            workdir = str(PurePosixPath(workdir, rest))
        elif word == "RUN" and re.search(r"pip install(\s[^&]*)?\s\.(\s|$)", rest):
            return workdir
    raise AssertionError(f"{dockerfile}: no `pip install .` step")


def app_files(dockerfile: Path = SERVICE_DOCKERFILE) -> set[str]:
    """The image's files in the source tree that `pip install .` builds from, relative to it."""
    prefix = build_dir(dockerfile).rstrip("/") + "/"
    return {path[len(prefix):] for path in image_files(dockerfile) if path.startswith(prefix)}


# ------------------------------------------------------------------------------------ pyproject.toml

def shipped_files(root: Path = ROOT, only: str | None = None) -> set[str]:
    """The files `pip install .` puts in the wheel, found with setuptools' own discovery and pyproject's
    [tool.setuptools] configuration: each package's modules and its package-data globs."""
    from setuptools import find_namespace_packages, find_packages

    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = config["packages"]["find"]
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages
    where = root / find.get("where", ["."])[0]
    packages = finder(where=str(where), include=find.get("include", ["*"]), exclude=find.get("exclude", []))
    package_data = config.get("package-data", {})
    out = set()
    for package in packages:
        if only and package.split(".")[0] != only:
            continue
        pkg_dir = where / package.replace(".", "/")
        out |= {str(p.relative_to(root)) for p in pkg_dir.glob("*.py")}
        for pattern in package_data.get(package, []) + package_data.get("*", []):
            for path in glob.glob(str(pkg_dir / pattern), recursive=True):
                if os.path.isfile(path) and "__pycache__" not in path:
                    out.add(str(Path(path).relative_to(root)))
    return {p.replace(os.sep, "/") for p in out}


# ------------------------------------------------------------------------------------ the tests

def test_dockerignore_matching_follows_docker():
    rules = [(False, _pattern_regex(p)) for p in ("**/__pycache__", "var", "*.md", "docs/**/*.txt")]
    rules.append((True, _pattern_regex("README.md")))
    assert ignored(rules, "a/b/__pycache__/x.pyc") and ignored(rules, "__pycache__/x.pyc")
    assert ignored(rules, "var/db.sqlite3") and not ignored(rules, "inventory/var/x")
    assert ignored(rules, "NOTES.md") and not ignored(rules, "README.md") and not ignored(rules, "claims/README.md")
    assert ignored(rules, "docs/a/b/c.txt") and ignored(rules, "docs/c.txt")


def test_dockerignore_keeps_local_state_and_secrets_out():
    rules = load_dockerignore(ROOT)
    for path in (".git/config", ".venv/bin/python", "var/draservice.sqlite3", ".env", "inventory/.env.prod",
                 "claims/__pycache__/views.cpython-311.pyc", "staticfiles/x.css", "tests/conftest.py",
                 "bench-results/keepalive.json", "deploy/agent/agent.yaml", "tls/server.key", "build/lib/x.py"):
        assert ignored(rules, path), path


def test_image_covers_every_package_and_package_data_pyproject_ships():
    image = app_files()
    shipped = shipped_files()
    # Sanity of the discovery itself: every top-level package pyproject lists, templates, static, demo data.
    tops = {p.split("/")[0] for p in shipped}
    assert {"draservice", "dra", "inventory", "claims", "frontend", "gangs", "agent"} <= tops
    assert any(p.startswith("frontend/static/") for p in shipped) and "inventory/demo/slices.json" in shipped
    assert any(p.startswith("gangs/templates/") for p in shipped)
    missing = sorted(shipped - image)
    assert not missing, f"the Dockerfile's COPY lines leave out {len(missing)} shipped files, e.g. {missing[:5]}"


def test_every_apps_templates_and_static_files_ship():
    """An app's pages need their templates in the wheel: a templates folder pyproject's package-data does not
    name is left out of `pip install .` (the Queues pages' were)."""
    shipped = shipped_files()
    tops = {p.split("/")[0] for p in shipped}
    present = {str(p.relative_to(ROOT)).replace(os.sep, "/") for top in tops for folder in ("templates", "static")
               for p in (ROOT / top / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert any(p.startswith("scheduler/templates/") for p in present)
    missing = sorted(present - shipped)
    assert not missing, f"pyproject.toml's package-data leaves out {len(missing)} files, e.g. {missing[:5]}"


def test_image_has_what_its_commands_need():
    image = app_files()
    # pip install . reads pyproject.toml and its readme; CMD runs gunicorn with its config file; manage.py
    # runs collectstatic at build and migrate in docker-compose.yml.
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert {"pyproject.toml", readme, "manage.py", "gunicorn.conf.py"} <= image
    cmd = json.loads(next(rest for word, rest in instructions(SERVICE_DOCKERFILE) if word == "CMD"))
    assert cmd[:3] == ["gunicorn", "-c", "gunicorn.conf.py"] and "draservice.wsgi:application" in cmd
    assert not {p for p in image if p.startswith(("tests/", ".git/", "var/", "benchmarks/"))}


def test_agent_image_has_the_agent_package():
    have = app_files(AGENT_DOCKERFILE)
    assert shipped_files(only="agent") <= have and {"pyproject.toml", "README.md"} <= have


def _build_step() -> str:
    """The Dockerfile's RUN line that installs the project: this test runs its equivalent, so it must not drift."""
    runs = [rest for word, rest in instructions(SERVICE_DOCKERFILE) if word == "RUN"]
    step = next(r for r in runs if "collectstatic" in r)
    assert re.fullmatch(r"pip install (--no-deps )?\. && python manage\.py collectstatic --noinput", step), step
    return step


def _isolated_env(*paths: Path) -> dict:
    site = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DJANGO", "DRASERVICE"))}
    # No DATABASE_URL: the image build has none either (the embedded default, never opened by these commands).
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), site])
    return env


@pytest.mark.slow
def test_the_image_build_step_succeeds_on_exactly_the_copied_files(tmp_path):
    _build_step()
    app = tmp_path / "app"
    for rel in app_files():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, app / rel)
    py, site = sys.executable, tmp_path / "site"
    # `pip install --no-deps .`: setuptools' build_py is the step of it that decides which modules and data
    # files land in site-packages (the wheel's content). Run directly, because this virtualenv has no `wheel`
    # and an offline test cannot fetch setuptools>=68 for pip's isolated build.
    done = subprocess.run([py, "-W", "ignore", "-c", "from setuptools import setup; setup()", "-q", "build_py",
                           "--build-lib", str(site)], cwd=app, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # `python manage.py collectstatic --noinput` in WORKDIR, as the image runs it (-S: no editable finder).
    env = _isolated_env(site)
    env["DRASERVICE_VAR_DIR"] = str(tmp_path / "var")
    done = subprocess.run([py, "-S", "manage.py", "collectstatic", "--noinput", "-v0"], cwd=app, env=env,
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (app / "staticfiles" / "frontend").is_dir()
    installed = {str(p.relative_to(site)).replace(os.sep, "/") for p in site.rglob("*") if p.is_file()}
    missing = sorted(shipped_files() - installed)
    assert not missing, f"`pip install .` in the image would leave out {missing[:5]}"
    # The installed wheel alone (no source tree on the path), as `draservice-agent` and any import from
    # site-packages would see it: the apps load, the templates and the demo data are there.
    code = ("import django; django.setup(); from django.core.management import call_command; call_command('check');"
            "from django.template.loader import get_template; get_template('frontend/base.html');"
            "get_template('gangs/list.html'); from inventory import demo; assert demo.standard_device_classes()")
    done = subprocess.run([py, "-S", "-c", code], cwd=tmp_path, env={**env, "DJANGO_SETTINGS_MODULE":
                          "draservice.settings"}, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
