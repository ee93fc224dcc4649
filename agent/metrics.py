"""Prometheus metrics of the agent, on their own registry (served on ``--metrics-port`` when set).

A separate registry keeps the agent's series apart from anything else living in the same process
(the tests run the agent next to the Django service, which uses the default registry)."""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

log = logging.getLogger("agent.metrics")

REGISTRY = CollectorRegistry()

SYNC_LAG = Gauge(
    "draservice_agent_sync_lag_seconds",
    "Age of the oldest cluster change not yet pushed to the service (0 when in sync)",
    registry=REGISTRY)
PENDING_CHANGES = Gauge(
    "draservice_agent_pending_changes", "Changed objects waiting to be pushed", registry=REGISTRY)
LAST_FULL_SYNC = Gauge(
    "draservice_agent_last_full_sync_timestamp_seconds", "When the last full sync was accepted",
    registry=REGISTRY)
PUSHES = Counter(
    "draservice_agent_pushes_total", "Pushes to the service by kind (full, slice, node) and outcome",
    ["kind", "outcome"], registry=REGISTRY)
ERRORS = Counter(
    "draservice_agent_errors_total", "Errors by component (service, watch, list, claims, heartbeat)",
    ["component"], registry=REGISTRY)
WATCH_EVENTS = Counter(
    "draservice_agent_watch_events_total", "Watch events received", ["resource", "type"],
    registry=REGISTRY)
RELISTS = Counter(
    "draservice_agent_relists_total", "Full lists of a resource, by reason (start, expired, error)",
    ["resource", "reason"], registry=REGISTRY)
CLAIM_WRITEBACKS = Counter(
    "draservice_agent_claim_writebacks_total", "status.allocation writes to cluster claims by outcome",
    ["outcome"], registry=REGISTRY)
CLAIM_CONFLICTS = Counter(
    "draservice_agent_claim_conflicts_total", "409 Conflicts on cluster claim writes (re-read and retried)",
    registry=REGISTRY)
HEARTBEATS = Counter(
    "draservice_agent_heartbeats_total", "Heartbeats sent by outcome", ["outcome"], registry=REGISTRY)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address, registry=REGISTRY)
    log.info("metrics on http://%s:%d/metrics", address, port)
