"""/metrics against a seeded fleet: capacity and free counts (the dashboard's own), pending claims and their
age per queue and namespace, the allocation histograms, stale clusters, route-labelled HTTP metrics; and every
metric and label the shipped Grafana board and alert rules use is in the scrape."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
import yaml
from django.urls import resolve
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from claims.models import AllocationRound, ClaimEvent, ResourceClaim
from claims.services.figures.fleet import fleet_overview
from frontend import metrics as fleet_metrics
from inventory.models import Cluster
from scheduler import tasks
from scheduler.services import allocation, round_log
from tests.claims import fleet as fleet_helpers
from tests.claims.fleet import gpu_claim
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[1]
NS = "/api/v1/namespaces"


def scrape(client) -> dict[str, list]:
    """{sample name: [(labels, value)]} from one scrape."""
    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.content
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(resp.content.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float:
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert found, f"{name}{labels} not in the scrape"
    return sum(found)


@pytest.fixture
def seeded(admin_client):
    """c1 (two 8xH100 nodes) with a 2-GPU claim and a shared 1-GPU claim allocated; c-old (one node), stale;
    pending: an unsatisfiable claim in team-a (10 min old) and two in team-b (queue "research")."""
    fleet_metrics._cache.clear()
    fleet_helpers.load_fleet({"c1": [("h100", 2)], "c-old": [("h100", 1)]})
    Cluster.objects.filter(name="c-old").update(last_sync_at=timezone.now() - timedelta(hours=1),
                                                last_heartbeat_at=None)
    assert admin_client.post("/api/v1/queues", queue_body("research", namespaces=["team-b"]),
                             format="json").status_code == 201
    for ns, body in (("team-a", gpu_claim("job", count=2)), ("team-a", gpu_claim("shared-gpu")),
                     ("team-a", gpu_claim("huge", count=9)), ("team-b", gpu_claim("big-1", count=9)),
                     ("team-b", gpu_claim("big-2", count=9))):
        assert admin_client.post(f"{NS}/{ns}/resourceclaims", body, format="json").status_code == 201
    for pod in ("pod-a", "pod-b"):
        assert admin_client.post(f"{NS}/team-a/consumers", {"metadata": {"name": pod}, "spec": {"resourceClaims": [
            {"name": "gpu", "resourceClaimName": "shared-gpu"}]}}, format="json").status_code == 201
    # "job" was submitted 42 s before it is allocated; "huge" has waited 10 minutes.
    earlier = timezone.now() - timedelta(seconds=42)
    ResourceClaim.objects.filter(name="job").update(created_at=earlier)
    ClaimEvent.objects.filter(claim_name="job", type="Created").update(created_at=earlier)
    tasks.allocate_pending()
    ResourceClaim.objects.filter(name="huge").update(created_at=timezone.now() - timedelta(minutes=10))
    assert ResourceClaim.objects.get(name="job").phase == "Allocated"
    assert ResourceClaim.objects.get(name="huge").phase == "Pending"


def test_fleet_gauges_are_the_dashboards_counts(admin_client, seeded):
    s = scrape(admin_client)
    gpus = {"driver": "gpu.nvidia.com"}
    total = value(s, "draservice_fleet_devices", cluster="c1", **gpus)
    allocated = value(s, "draservice_fleet_devices_allocated", cluster="c1", **gpus)
    assert (total, allocated) == (16, 3)  # two nodes of 8 H100; the 2-GPU job and the shared GPU
    assert value(s, "draservice_fleet_devices_shared", cluster="c1", **gpus) == 1
    assert value(s, "draservice_fleet_devices_free", cluster="c1", **gpus) == total - allocated == 13
    # Nothing on the stale cluster is offered: its 8 GPUs are stale, none free.
    assert value(s, "draservice_fleet_devices", cluster="c-old", **gpus) == 8
    assert value(s, "draservice_fleet_devices_stale", cluster="c-old", **gpus) == 8
    assert value(s, "draservice_fleet_devices_free", cluster="c-old") == 0
    # The same numbers as the dashboard's overview, cluster by cluster, and the states add up.
    for group in fleet_overview()["by_cluster"]:
        t = group.tally
        for suffix, attr in (("", "total"), ("_allocated", "allocated"), ("_shared", "shared"),
                             ("_tainted", "tainted"), ("_stale", "stale"), ("_invalid", "invalid"), ("_free", "free")):
            assert value(s, f"draservice_fleet_devices{suffix}", cluster=group.key) == getattr(t, attr), suffix
        parts = ("allocated", "tainted", "stale", "invalid", "free")
        assert sum(value(s, f"draservice_fleet_devices_{p}", cluster=group.key) for p in parts) == t.total
    gpu_products = {lab["product"] for lab, _ in s["draservice_fleet_devices"] if lab["driver"] == "gpu.nvidia.com"}
    assert len(gpu_products) == 1 and "H100" in gpu_products.pop()


def test_stale_clusters(admin_client, seeded):
    s = scrape(admin_client)
    assert value(s, "draservice_clusters_stale") == 1 and value(s, "draservice_clusters") == 2
    assert value(s, "draservice_cluster_stale", cluster="c-old") == 1
    assert value(s, "draservice_cluster_stale", cluster="c1") == 0
    assert 3599 <= value(s, "draservice_cluster_last_seen_age_seconds", cluster="c-old") < 3700


def test_pending_by_queue_and_top_namespaces(admin_client, seeded, settings):
    s = scrape(admin_client)
    assert value(s, "draservice_queue_pending_claims", queue="default") == 1
    assert value(s, "draservice_queue_pending_claims", queue="research") == 2
    assert 600 <= value(s, "draservice_queue_oldest_pending_seconds", queue="default") < 700
    assert 0 <= value(s, "draservice_queue_oldest_pending_seconds", queue="research") < 60
    assert 600 <= value(s, "draservice_claims_oldest_pending_seconds") < 700
    assert value(s, "draservice_namespace_pending_claims", namespace="team-b") == 2
    assert value(s, "draservice_namespace_pending_claims", namespace="team-a") == 1
    settings.METRICS_TOP_NAMESPACES = 1  # only the namespace with the most pending claims has a series
    s = scrape(admin_client)
    assert [lab["namespace"] for lab, _ in s["draservice_namespace_pending_claims"]] == ["team-b"]
    assert [lab["namespace"] for lab, _ in s["draservice_namespace_oldest_pending_seconds"]] == ["team-b"]


def test_allocation_histograms_from_the_database(admin_client, seeded, settings):
    s = scrape(admin_client)
    name = "draservice_claim_submit_to_allocated_seconds"
    # "shared-gpu" was allocated within seconds of its submission, "job" 42 s after its own.
    assert value(s, f"{name}_bucket", le="10.0") == value(s, f"{name}_bucket", le="30.0") == 1
    assert value(s, f"{name}_bucket", le="60.0") == 2
    assert value(s, f"{name}_bucket", le="+Inf") == value(s, f"{name}_gcount") == 2
    assert 42 <= value(s, f"{name}_gsum") < 50
    rounds = AllocationRound.objects.count()
    assert rounds >= 1 and value(s, "draservice_allocation_round_seconds_gcount") == rounds
    assert value(s, "draservice_allocation_round_seconds_bucket", le="+Inf") == rounds
    assert value(s, "draservice_allocation_round_claims", outcome="allocated") == 2
    assert value(s, "draservice_allocation_round_claims", outcome="pending") == 3
    assert value(s, "draservice_allocation_round_errors") == 0
    settings.METRICS_WINDOW_ROWS = 1  # the bound: only the newest rows are read
    assert value(scrape(admin_client), f"{name}_gcount") == 1
    settings.METRICS_WINDOW_ROWS = 20000
    # A round that raises is counted (and the task still fails); rows older than the window are not.
    AllocationRound.objects.update(finished_at=timezone.now() - timedelta(hours=2))
    with mock.patch.object(allocation, "allocate_round", side_effect=RuntimeError("engine blew up")), \
            pytest.raises(RuntimeError):
        tasks.allocate_pending()
    s = scrape(admin_client)
    assert value(s, "draservice_allocation_round_errors") == 1
    assert value(s, "draservice_allocation_round_seconds_gcount") == 1
    assert round_log.purge() == rounds  # the hourly purge drops the old rows, keeps the new one
    assert AllocationRound.objects.get().error.startswith("RuntimeError: engine blew up")


def test_unchanged_fleet_is_not_reaggregated(admin_client, seeded):
    with mock.patch.object(fleet_metrics, "overview_rows", wraps=fleet_metrics.overview_rows) as rows:
        first = scrape(admin_client)
        scrape(admin_client)
        assert rows.call_count == 1  # the second scrape read the cached families
        admin_client.post(f"{NS}/team-a/resourceclaims/job/release")
        after = scrape(admin_client)
        assert rows.call_count == 2  # an allocation row went away: the key moved
        Cluster.objects.filter(name="c1").update(last_sync_at=timezone.now() - timedelta(hours=1),
                                                 last_heartbeat_at=None)
        stale = scrape(admin_client)
        assert rows.call_count == 3  # staleness is time-dependent: part of the key
    assert value(after, "draservice_fleet_devices_free", cluster="c1") == \
        value(first, "draservice_fleet_devices_free", cluster="c1") + 2
    assert value(stale, "draservice_fleet_devices_free", cluster="c1") == 0


def test_http_metrics_are_labelled_by_route_not_path(admin_client, seeded):
    path = f"{NS}/team-a/resourceclaims/job"
    assert admin_client.get(path).status_code == 200
    assert admin_client.get("/no/such/page/team-a-secret").status_code == 404
    s = scrape(admin_client)
    routes = {lab["route"] for lab, _ in s["draservice_http_requests_total"]}
    pattern = resolve(path).route
    assert "<" in pattern and "team-a" not in pattern  # a pattern, with its converters
    assert value(s, "draservice_http_requests_total", route=pattern, method="GET", status="200") >= 1
    assert value(s, "draservice_http_requests_total", route="unmatched", status="404") >= 1
    assert not any("team-a" in r or "job" in r.split("/") for r in routes), routes
    assert value(s, "draservice_http_request_seconds_count", route=pattern, method="GET") >= 1


# --------------------------------------------------------------------------- the shipped board and alerts

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset"}
TARGET_LABELS = {"instance", "job", "pod"}  # added by Prometheus to every scraped series
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def promql_uses(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression reads. Metric names are the draservice_ identifiers (sample
    names, suffixes included); labels those in matchers and in by/without/on/ignoring/group_* lists."""
    expr = re.sub(r"\$\{?\w+\}?", "x", expr)  # Grafana variables such as $__rate_interval
    metrics = set(re.findall(r"\bdraservice_[a-zA-Z0-9_]+", expr))
    labels: set[str] = set()
    for group in LABEL_LISTS.findall(expr):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    for group in MATCHERS.findall(re.sub(r'"[^"]*"', '""', expr)):
        labels |= set(MATCHER.findall(group))
    return metrics, labels


def board_expressions() -> list[tuple[str, str]]:
    """(expression, legend) of every query of the dashboard, panels nested in rows included."""
    board = json.loads((ROOT / "deploy" / "grafana" / "draservice.json").read_text())
    out = []

    def walk(node):
        if isinstance(node, dict):
            if "expr" in node:
                out.append((node["expr"], node.get("legendFormat", "")))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(board.get("panels", []))
    for var in board.get("templating", {}).get("list", []):  # label_values(metric, label)
        for metric, label in re.findall(r"label_values\((\w+),\s*(\w+)\)", var.get("definition", "")):
            out.append((metric, "{{" + label + "}}"))
    return out


def alert_expressions() -> list[tuple[str, str]]:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    out = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            text = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
            out.append((rule["expr"], text))
    return out


def test_every_metric_and_label_the_board_and_alerts_use_is_scraped(admin_client, seeded):
    admin_client.get(f"{NS}/team-a/resourceclaims/job")  # so the HTTP series exist
    s = scrape(admin_client)
    labels_of: dict[str, set[str]] = {}
    for name, samples in s.items():
        for lab, _ in samples:
            labels_of.setdefault(name, set()).update(lab)
    board, alerts = board_expressions(), alert_expressions()
    assert len(board) >= 10 and len(alerts) >= 3
    checked = set()
    for expr, text in board + alerts:
        metrics, labels = promql_uses(expr)
        assert metrics, f"no draservice metric in {expr!r}"
        missing = metrics - set(s)
        assert not missing, f"{expr!r} uses {missing}, not in the scrape"
        # Legends and annotations name labels as {{label}} / {{ $labels.label }}.
        labels |= set(re.findall(r"\{\{\s*(?:\$labels\.)?([a-zA-Z_]\w*)\s*\}\}", text)) - {"value", "$value"}
        available = set().union(*(labels_of[m] for m in metrics))
        unknown = labels - available - PROMQL_WORDS - TARGET_LABELS
        assert not unknown, f"{expr!r} uses labels {unknown}; the scrape has {sorted(available)}"
        checked |= metrics
    # The board covers what issue 17 asks it to show.
    for needed in ("draservice_fleet_devices_free", "draservice_queue_pending_claims",
                   "draservice_queue_oldest_pending_seconds", "draservice_claim_submit_to_allocated_seconds_bucket",
                   "draservice_allocation_round_seconds_bucket", "draservice_http_requests_total",
                   "draservice_clusters_stale"):
        assert needed in checked, needed


def test_prometheus_scrape_config_sends_a_bearer_token():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "draservice")
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    assert "alerts.yml" in " ".join(config["rule_files"])


def grafana_to_promql(expr: str) -> str:
    """A board expression as Prometheus would receive it from Grafana (variables substituted)."""
    return expr.replace("$__rate_interval", "2m").replace("$driver", ".*").replace("$cluster", ".*")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus) is not installed")
def test_promtool_accepts_the_rules_the_config_and_every_board_expression(tmp_path):
    """promtool parses each expression (the name and label test above cannot tell broken PromQL)."""
    recorded = [{"record": f"board:expr{i}", "expr": grafana_to_promql(expr)}
                for i, (expr, _) in enumerate(board_expressions())]
    rules = {"groups": [{"name": "board", "rules": recorded}]}
    (tmp_path / "board.yml").write_text(yaml.safe_dump(rules))
    for args in (["check", "rules", str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
                 ["check", "rules", str(tmp_path / "board.yml")]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    # The scrape config, with its token file where the test can put one.
    config = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    (tmp_path / "token").write_text("x")
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/secrets/draservice-token",
                                                            str(tmp_path / "token")))
    shutil.copy(ROOT / "deploy" / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    done = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
