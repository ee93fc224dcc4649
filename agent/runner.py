"""The agent: discovery, then the inventory sync, the claim write-back and the heartbeat, side by side.

Threads (all daemons, all stopped by one ``stop`` event):

* one informer per watched resource (nodes, resourceslices, deviceclasses, devicetaintrules,
  resourceclaims), each a list+watch loop feeding a local cache;
* ``inventory-pusher``: the only writer of inventory to the service (see agent.inventory);
* ``claims``: mirrors marked ResourceClaims to the service and writes allocations back (agent.claims);
* ``heartbeat``: tells the service the agent is alive, with its lag and last error.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from agent import __version__, metrics
from agent.backoff import Backoff
from agent.claims import ClaimSync
from agent.inventory import InventorySync
from agent.kube import KubeClient
from agent.service import ServiceClient, ServiceError

log = logging.getLogger("agent")


@dataclass
class Settings:
    resync_period: float = 600.0  # seconds between full syncs
    heartbeat_interval: float = 10.0  # well within the 30 s a reservedFor report needs (a preemption victim)
    watch_timeout: int = 300  # server-side watch timeout (randomised up to twice this)
    batch_delay: float = 0.2  # how long to let a burst of changes collect before pushing
    full_sync_threshold: int = 500  # more pending objects than this: push one full sync instead
    claims: bool = True  # mirror marked ResourceClaims and write allocations back
    claim_poll_interval: float = 2.0  # how often pending claims are checked in the service
    claim_sweep_period: float = 60.0  # how often service claims of deleted cluster claims are looked for
    backoff_cap: float = 60.0


class Agent:
    def __init__(self, kube: KubeClient, service: ServiceClient, settings: Settings | None = None):
        self.kube = kube
        self.service = service
        self.settings = settings or Settings()
        self.stop_event = threading.Event()
        self.inventory: InventorySync | None = None
        self.claims: ClaimSync | None = None
        self.resources: dict = {}
        self.kubernetes_version = "unknown"
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Discover what the cluster serves (retrying until the API server answers), then start."""
        s = self.settings
        backoff = Backoff(base=1.0, cap=s.backoff_cap)
        while not self.stop_event.is_set():
            try:
                self.kubernetes_version = self.kube.server_version()
                self.resources = self.kube.discover_resources()
                break
            except Exception as exc:  # noqa: BLE001 - API server not reachable yet: keep trying
                metrics.ERRORS.labels("discovery").inc()
                delay = backoff.next_delay()
                log.warning("cannot reach the Kubernetes API at %s (%s); retrying in %.1fs", self.kube.host, exc, delay)
                self.stop_event.wait(delay)
        if self.stop_event.is_set():
            return
        log.info("draservice-agent %s: cluster %r (Kubernetes %s at %s) -> %s; resource.k8s.io: %s",
                 __version__, self.service.cluster, self.kubernetes_version, self.kube.host, self.service.base_url,
                 ", ".join(f"{p} {r.version}" for p, r in sorted(self.resources.items())) or "not served")
        self.inventory = InventorySync(
            self.kube, self.service, self.resources, self.stop_event, resync_period=s.resync_period,
            batch_delay=s.batch_delay, full_sync_threshold=s.full_sync_threshold, watch_timeout=s.watch_timeout,
            backoff=Backoff(base=1.0, cap=s.backoff_cap))
        self.inventory.start()
        if s.claims and "resourceclaims" in self.resources:
            inventory = self.inventory
            self.claims = ClaimSync(self.kube, self.service, self.resources["resourceclaims"], self.stop_event,
                                    poll_interval=s.claim_poll_interval, sweep_period=s.claim_sweep_period,
                                    watch_timeout=s.watch_timeout, backoff_cap=s.backoff_cap,
                                    ready=lambda: inventory.last_full_sync is not None)
            self.claims.start()
        elif s.claims:
            log.warning("the cluster serves no ResourceClaims: claim write-back is off")
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        heartbeat.start()
        self._threads.append(heartbeat)

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        # Wake every thread from whatever it waits on: watches (sockets), the pusher, the claims queue.
        self.kube.close_watches()
        if self.inventory:
            self.inventory.wake()
        if self.claims:
            self.claims.wake()
        deadline = time.monotonic() + timeout
        threads: list[threading.Thread | None] = list(self._threads)
        if self.inventory:
            threads += [i.thread for i in self.inventory.informers.values()] + [self.inventory.thread]
        if self.claims:
            threads += [self.claims.informer.thread, self.claims.thread]
        for thread in threads:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        self.service.close()

    def run_forever(self) -> None:
        self.start()
        while not self.stop_event.wait(3600):
            pass

    def run_once(self, timeout: float = 60.0) -> bool:
        """List everything, push one full sync, stop. For a first test of a token and a cluster: it
        gives up after ``timeout`` seconds, logging the last error, rather than retrying for ever."""
        self.settings.claims = False
        self.start()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and not self.stop_event.is_set():
                if self.inventory and self.inventory.in_sync():
                    self.send_heartbeat()
                    return True
                time.sleep(0.1)
            if self.inventory and self.inventory.last_error:
                log.error("no full sync accepted within %.0fs; last error: %s", timeout, self.inventory.last_error)
            return False
        finally:
            self.stop()

    # -- heartbeat --------------------------------------------------------------------------------
    def status(self) -> dict:
        inv = self.inventory
        return {
            "agentVersion": __version__,
            "kubernetesVersion": self.kubernetes_version,
            "apiVersions": {p: r.api_version for p, r in sorted(self.resources.items())},
            "synced": bool(inv and inv.synced),
            "syncLagSeconds": round(inv.lag(), 3) if inv else None,
            "pendingChanges": inv.pending() if inv else None,
            "lastFullSyncAt": _iso(inv.last_full_sync) if inv and inv.last_full_sync else None,
            "lastError": (inv.last_error if inv else None) or (self.claims.last_error if self.claims else None),
            "claimsMirrored": self.claims.mirrored_count() if self.claims else 0,
        }

    def send_heartbeat(self) -> None:
        # The service stores agentVersion in its own column and ``status`` as given (the dashboard shows it).
        self.service.heartbeat({"agentVersion": __version__, "status": self.status()})

    def _heartbeat_loop(self) -> None:
        backoff = Backoff(base=self.settings.heartbeat_interval / 4 or 1.0, cap=self.settings.backoff_cap)
        failing = False
        while not self.stop_event.is_set():
            try:
                self.send_heartbeat()
                metrics.HEARTBEATS.labels("ok").inc()
                if failing:
                    log.info("heartbeat accepted again")
                failing = False
                backoff.reset()
                wait = self.settings.heartbeat_interval
            except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive any one failure
                metrics.HEARTBEATS.labels("error").inc()
                metrics.ERRORS.labels("heartbeat").inc()
                if not failing:  # one line per outage, not one per attempt
                    log.warning("heartbeat failed: %s", exc, exc_info=not isinstance(exc, ServiceError))
                failing = True
                wait = min(self.settings.heartbeat_interval, backoff.next_delay())
            self.stop_event.wait(wait)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
