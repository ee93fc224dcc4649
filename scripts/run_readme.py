"""Run the README's shell sections in order against a fresh ``make run``, as a new user would.

    .venv/bin/python scripts/run_readme.py [--timeout 120]

Starts ``make run`` on free ports (its HTTPS beside on another) with a var directory of its own (a fresh
SQLite database and certificate), then runs the ```sh blocks of the sections in RUN, in the README's order,
in ONE bash (``set -euo pipefail``: what a block sets, the next one uses) in a scratch directory where
``.venv``, ``manage.py`` and ``var`` lead to the service's. The README's ports 8000 and 8443 become the chosen
ones. Blocks of other sections are listed as skipped with the reason. Exit status: bash's (0 when every
command succeeded), 124 on timeout. Prints each command as it runs (bash -x).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ("A first claim, from a CI pipeline", "Queues: two teams, a CI pipeline, one preemption")
SKIPPED = {"Set-up (fresh machine: Python 3.11 and make)": "`make run` is what this script starts; `make test` "
                                                           "is the suite itself",
           "Running for real: PostgreSQL + Redis + separate Celery workers": "production processes on port 8000, "
                                                                             "PostgreSQL and Redis"}


def sections(readme: str) -> list[tuple[str, str]]:
    """(section heading, block) for every ```sh block, in order."""
    out, heading = [], ""
    for match in re.finditer(r"^## ([^\n]+)$|^```sh\n(.*?)^```$", readme, re.M | re.S):
        if match.group(1):
            heading = match.group(1).strip()
        else:
            out.append((heading, match.group(2)))
    return out


def _free_pair() -> tuple[int, int]:
    """A port and port + 443, both free (make run's HTTP and HTTPS)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 443 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 443))
            except OSError:
                continue
        return port, port + 443
    raise RuntimeError("no free pair of ports")


def _wait_up(url: str, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"make run exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"make run did not answer {url} within {seconds} s")


def script(readme: str, port: int, https_port: int) -> str:
    lines = ["set -euo pipefail -x"]
    found = {heading for heading, _ in sections(readme)}
    if set(RUN) - found:
        raise SystemExit(f"the README has no shell block under {sorted(set(RUN) - found)}: update RUN")
    for heading, block in sections(readme):
        if heading not in RUN:
            print(f"skipped: a block of '{heading}' ({SKIPPED.get(heading, 'not a step of the walk-through')})")
            continue
        lines.append(f": '--- {heading}'")
        lines.append(block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                     .replace("127.0.0.1:8443", f"127.0.0.1:{https_port}"))
    return "\n".join(lines) + "\n"


def run(timeout: float) -> int:
    port, https_port = _free_pair()
    with tempfile.TemporaryDirectory(prefix="readme-") as scratch:
        var, work = Path(scratch) / "var", Path(scratch) / "work"
        var.mkdir()
        work.mkdir()
        for name in (".venv", "manage.py"):
            (work / name).symlink_to(ROOT / name)
        (work / "var").symlink_to(var)
        # The embedded default, as on a fresh machine: no database or broker from the caller's environment.
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "KUBECONFIG")}
        env["DRASERVICE_VAR_DIR"] = str(var)
        log_path = Path(scratch) / "make-run.log"
        with open(log_path, "w") as log:
            service = subprocess.Popen(["make", "run", f"PORT={port}", f"HTTPS_PORT={https_port}"], cwd=ROOT,
                                       env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                _wait_up(f"http://127.0.0.1:{port}/livez", service, 120)
                text = script((ROOT / "README.md").read_text(), port, https_port)
                code = subprocess.run(["bash", "-c", text], cwd=work, env=env, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                print(f"the README's commands took more than {timeout} s", file=sys.stderr)
                code = 124
            finally:
                os.killpg(service.pid, signal.SIGTERM)
                try:
                    service.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(service.pid, signal.SIGKILL)
        if code != 0:
            print("make run's log, last lines:\n" + "\n".join(log_path.read_text().splitlines()[-30:]),
                  file=sys.stderr)
        return code


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=120, help="seconds for the README's commands")
    return run(parser.parse_args().timeout)


if __name__ == "__main__":
    sys.exit(main())
