#!/usr/bin/env python
"""Screenshots of the dashboard's pages, for a reviewer, each in the light and the dark theme:
``<out>/NN-page-light.png`` and ``<out>/NN-page-dark.png``.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/draservice .venv/bin/python scripts/screenshots.py
    [OUT_DIR (default: screenshots)] [--nodes 48] [--width 1440] [--height 900] [--keep]

Self-contained: creates a throw-away database (``<name>_screens``), loads the demo fleet and the demo workload
(``frontend.demo``: claims allocated by the real engine, shared devices, MIG partitions, pending claims), and a
day of utilisation history, then serves the app with ``manage.py runserver`` and drives Debian's Chromium
(``/usr/bin/chromium``) through Playwright. Nothing touches the database named in DATABASE_URL itself.

The history is made by really changing the workload (claims created and released through the claims
services, snapshots recorded by the claims service) 24 times; only the snapshots' clock is moved back an hour
per step, so the charts show a day instead of a minute.
"""
import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")

CHROMIUM = "/usr/bin/chromium"
USER, PASSWORD = "reviewer", "screenshots-only-password"


def history(hours: int = 24) -> None:
    """Real churn, one utilisation snapshot per step, each stamped an hour apart; released at the end."""
    from django.utils import timezone

    from claims.models import UtilisationSnapshot
    from claims.services.claims import create_claims, release_claim
    from claims.services.utilisation import record_snapshot
    from frontend.demo import GPU, H100, L4, claim, request

    now = timezone.now()
    live: list[int] = []
    # A daily curve of claims in flight: busy in the (simulated) afternoon, quiet at night.
    curve = [4, 3, 2, 2, 3, 5, 9, 14, 20, 24, 26, 28, 28, 26, 24, 22, 20, 18, 15, 12, 10, 8, 6, 5]
    shapes = [(8, H100), (1, L4), (4, H100), (1, L4), (2, H100), (1, H100), (2, L4)]
    for step in range(hours):
        want = curve[step % len(curve)]
        while len(live) > want:
            release_claim(live.pop(0))
        new = []
        for i in range(max(0, want - len(live))):
            count, selector = shapes[(step + i) % len(shapes)]
            new.append(claim(f"batch-{step:02d}-{i}", [request("gpu", GPU, count, [selector])]))
        if new:
            live += [c.id for c in create_claims("batch", new)]
        before = set(UtilisationSnapshot.objects.values_list("id", flat=True))
        record_snapshot()
        UtilisationSnapshot.objects.exclude(id__in=before).update(taken_at=now - timedelta(hours=hours - step))
    for claim_id in live:
        release_claim(claim_id)


def prepare(nodes: int) -> dict:
    from django.contrib.auth import get_user_model

    from frontend import demo

    demo.load_fleet(nodes=nodes)
    history()
    info = demo.build_workload()
    get_user_model().objects.create_user(USER, password=PASSWORD, is_staff=True)
    return info


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(db_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "DEBUG": "false", "CELERY_BROKER_URL": ""}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "manage.py"), "runserver", f"127.0.0.1:{port}",
                             "--noreload"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(base + "/livez", timeout=1)
            return proc, base
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def shoot(base: str, out: str, info: dict, width: int, height: int) -> list[str]:
    from playwright.sync_api import sync_playwright

    from inventory.models import Device

    mig_cluster, mig_node = info["mig_node"]
    lab_cluster, lab_node = info["lab_node"]
    gpu = Device.objects.filter(attribute_index__has_key="gpu.nvidia.com/uuid").order_by("id").first()
    uuid = gpu.attribute_index["gpu.nvidia.com/uuid"] if gpu else "GPU-"
    mig = (Device.objects.filter(cluster__name=mig_cluster, node_name=mig_node).exclude(consumes_counters=[])
           .order_by("id").first())
    mig_key = f"{mig_cluster}/{mig.driver}/{mig.pool_name}/{mig.name}" if mig else ""
    gpu_key = f"{mig_cluster}/{mig.driver}/{mig.pool_name}/{mig.consumes_counters[0]['counterSet']}" if mig else ""
    pages = [
        ("overview", "/", None),
        ("utilisation", "/utilisation/?range=24h", "body[data-charts-ready=true]"),
        ("clusters", "/clusters/", None),
        ("cluster", "/clusters/aws-us-east-1/", None),
        ("node-mig-partitions", f"/clusters/{mig_cluster}/nodes/{mig_node}/", None),
        ("node-consumable-capacity", f"/clusters/{lab_cluster}/nodes/{lab_node}/", None),
        ("node-h100", "/clusters/aws-us-east-1/nodes/aws-h100-00000/", None),
        ("sharing", "/sharing/", None),
        ("fragmentation", "/fragmentation/", None),
        ("claims", "/claims/", None),
        ("claims-pending", "/claims/?phase=Pending", None),
        ("claim-pending-explained", "/claims/ci/needs-16-h100/", None),
        ("claim-nearest-miss", "/claims/ci/b200-job/", None),
        ("claim-mig-allocated", "/claims/research/mig-pair/", None),
        ("slices", "/inventory/slices/", None),
        ("pools", "/inventory/pools/", None),
        ("deviceclasses", "/inventory/deviceclasses/", None),
        ("taintrules", "/inventory/taintrules/", None),
        ("try-selector-page", "/inventory/try-selector/?class=gpu.nvidia.com&expression="
         + 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"', None),
        ("search-claims", "/search/?q=ci/", None),
        ("search-device-uuid", f"/search/?q={uuid}", None),
        ("history-node", f"/history/nodes/{mig_cluster}/{mig_node}/", "body[data-charts-ready=true]"),
        ("history-device", f"/history/devices/{mig_key}/", "body[data-charts-ready=true]"),
        ("history-gpu", f"/history/gpus/{gpu_key}/", "body[data-charts-ready=true]"),
        ("gangs", "/gangs/", None),
        ("queues", "/queues/", None),
        ("replays", "/replays/", None),
    ]
    os.makedirs(out, exist_ok=True)
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(base + "/login/")
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            written.append(os.path.join(out, f"00-login-{scheme}.png"))
            page.screenshot(path=written[-1])
        page.emulate_media(color_scheme="light")
        page.fill("#id_username", USER)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
        for n, (name, url, ready) in enumerate(pages, start=1):
            page.goto(base + url)
            page.wait_for_load_state("networkidle")
            # The theme follows the system setting (no toggle stored): emulate each, charts redraw on change.
            for scheme in ("light", "dark"):
                page.emulate_media(color_scheme=scheme)
                if ready:
                    page.wait_for_selector(ready)
                written.append(os.path.join(out, f"{n:02d}-{name}-{scheme}.png"))
                page.screenshot(path=written[-1], full_page=True)
            page.emulate_media(color_scheme="light")
        # The "try this selector" box, with an answer.
        page.goto(base + "/inventory/deviceclasses/gpu.nvidia.com/")
        page.fill("#expression", 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0')
        page.get_by_role("button", name="Validate & count matches").click()
        page.get_by_test_id("match-count").wait_for()
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            written.append(os.path.join(out, f"{len(pages) + 1:02d}-deviceclass-try-selector-{scheme}.png"))
            page.screenshot(path=written[-1], full_page=True)
        browser.close()
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=os.path.join(ROOT, "screenshots"),
                        help="directory for the PNGs (created if missing)")
    parser.add_argument("--nodes", type=int, default=48)
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--keep", action="store_true", help="keep the throw-away database")
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install chromium")

    import django
    from django.conf import settings

    django.setup()
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        raise SystemExit("Set DATABASE_URL to the PostgreSQL server (a throw-away database is created on it).")
    from django.db import connection

    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = db["NAME"] + "_screens"
    original = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    proc = None
    try:
        print("preparing the demo fleet, workload and a day of history ...", flush=True)
        info = prepare(args.nodes)
        connection.close()  # the server process uses the database from here on
        password = ":" + db["PASSWORD"] if db.get("PASSWORD") else ""
        url = f"postgresql://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        proc, base = serve(url)
        for path in shoot(base, args.out, info, args.width, args.height):
            print(path)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        if not args.keep:
            connection.creation.destroy_test_db(original, verbosity=0)


if __name__ == "__main__":
    main()
