"""Inventory sync: keep the service's copy of this cluster equal to the informers' caches.

One pusher thread owns every write to the service, so pushes are strictly ordered: a full sync built
from the caches can never overwrite a newer incremental push (two writers could, and the service would
then hold a stale slice until it changed again).

What gets pushed:

* a **full sync** (``PUT /clusters/{c}/inventory``): at start, every ``resync_period``, after a
  DeviceClass or DeviceTaintRule change (the service has no incremental API for those), when more than
  ``full_sync_threshold`` objects are pending, and after a failed full sync. It is built only once every
  informer has completed its first list, from caches that each hold one complete list plus the watch
  events since - never from a half-read list;
* **incremental** upserts/deletes of single ResourceSlices and Nodes in between, from a dirty set of
  keys. A key is looked up in the cache at push time, so ten changes to one slice are one push of its
  latest state, and a slice created and deleted during an outage is one DELETE.

When the service is unreachable nothing is dropped: a failed key goes back into the dirty set (a failed
full sync re-arms itself), and the pusher backs off exponentially with jitter until a push succeeds.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from agent import metrics
from agent.backoff import Backoff
from agent.informer import Informer
from agent.kube import NODES, KubeClient, Resource
from agent.service import ServiceClient, ServiceRejected, ServiceUnavailable

log = logging.getLogger("agent.inventory")

SLICES, CLASSES, TAINT_RULES = "resourceslices", "deviceclasses", "devicetaintrules"


def node_projection(obj: dict) -> dict:
    """All the service needs of a Node (its name and labels, for nodeSelectors). Caching only this keeps
    a 5,000-node cluster's Node objects (images, conditions...) out of the agent's memory."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "uid": meta.get("uid"),
                         "resourceVersion": meta.get("resourceVersion"), "labels": meta.get("labels") or {}}}


def node_body(obj: dict) -> dict:
    meta = obj["metadata"]
    return {"name": meta["name"], "labels": meta.get("labels") or {}}


class InventorySync:
    def __init__(self, kube: KubeClient, service: ServiceClient, resources: dict[str, Resource],
                 stop: threading.Event, *, resync_period: float = 600.0, batch_delay: float = 0.2,
                 full_sync_threshold: int = 500, watch_timeout: int = 300, backoff: Backoff | None = None):
        self.service = service
        self.stop = stop
        self.resync_period = resync_period
        self.batch_delay = batch_delay
        self.full_sync_threshold = full_sync_threshold
        self.backoff = backoff or Backoff(base=1.0, cap=60.0)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._dirty: dict[tuple[str, str], float] = {}  # (plural, name) -> when it first became dirty
        self._full_needed = True
        self._full_since: float | None = None  # oldest change that only a full sync will carry
        self.last_full_sync: float | None = None  # wall-clock time of the last accepted full sync
        self._pushing = False  # a push is in flight (its changes are out of the dirty set, not yet accepted)
        self.last_error: str | None = None
        self.service_down_since: float | None = None
        self.thread: threading.Thread | None = None

        self.informers: dict[str, Informer] = {}
        wanted = [(NODES, node_projection)] + [(resources[p], None) for p in (SLICES, CLASSES, TAINT_RULES)
                                               if p in resources]
        for resource, transform in wanted:
            kwargs: dict[str, Any] = {"transform": transform} if transform else {}
            self.informers[resource.plural] = Informer(
                kube, resource, self._change_handler(resource.plural), stop, watch_timeout=watch_timeout,
                on_synced=self._wake.set, **kwargs)
        missing = [p for p in (SLICES, CLASSES, TAINT_RULES) if p not in resources]
        if missing:
            log.info("the cluster does not serve %s; pushing them as empty", ", ".join(missing))

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()
        self.thread = threading.Thread(target=self.run, name="inventory-pusher", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        self._wake.set()

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    def in_sync(self) -> bool:
        """True when every informer has listed, a full sync was accepted, and nothing is pending or in flight."""
        with self._lock:
            return (self.synced and not self._dirty and not self._full_needed and not self._pushing
                    and self.last_full_sync is not None)

    # -- change intake (informer threads) ---------------------------------------------------------
    def _change_handler(self, plural: str):
        def handle(key: str, old: dict | None, new: dict | None) -> None:
            if plural == "nodes" and old and new and old["metadata"]["labels"] == new["metadata"]["labels"]:
                return  # a status-only Node update: nothing the service stores has changed
            now = time.monotonic()
            with self._lock:
                if plural in (CLASSES, TAINT_RULES):
                    self._require_full(now)
                else:
                    self._dirty.setdefault((plural, key), now)
                    if len(self._dirty) > self.full_sync_threshold:
                        self._require_full(min(self._dirty.values()))
                        self._dirty.clear()
            self._wake.set()
        return handle

    def _require_full(self, since: float | None) -> None:
        self._full_needed = True
        if since is not None:
            self._full_since = since if self._full_since is None else min(self._full_since, since)

    def lag(self) -> float:
        """Seconds since the oldest change that the service has not accepted yet."""
        with self._lock:
            times = list(self._dirty.values()) + ([self._full_since] if self._full_since is not None else [])
        return max(0.0, time.monotonic() - min(times)) if times else 0.0

    def pending(self) -> int:
        with self._lock:
            return len(self._dirty) + (1 if self._full_needed else 0)

    # -- the pusher -------------------------------------------------------------------------------
    def run(self) -> None:
        next_full = time.monotonic() + self.resync_period
        while not self.stop.is_set():
            self._wake.wait(timeout=max(0.0, min(next_full - time.monotonic(), 5.0)))
            self._update_gauges()
            if self.stop.is_set():
                break
            if time.monotonic() >= next_full:
                with self._lock:
                    self._require_full(None)  # periodic: repairs drift on the service side, not a change
                self._wake.set()
            if not self._wake.is_set():
                continue
            # Let a burst of events (a driver republishing its pool) collect into one round of pushes.
            if self.stop.wait(self.batch_delay):
                break
            self._wake.clear()
            if not self.synced:
                continue  # never push before every kind has been listed once; on_synced wakes us
            try:
                if self.push_once():
                    next_full = time.monotonic() + self.resync_period
                self._service_up()
            except ServiceUnavailable as exc:
                self._service_down(exc)
            except Exception as exc:  # noqa: BLE001 - a bug must not silently end the pusher
                log.exception("unexpected error while pushing; retrying with a full sync")
                with self._lock:
                    self._require_full(time.monotonic())
                self._service_down(ServiceUnavailable(f"{type(exc).__name__}: {exc}"))
            self._update_gauges()

    def push_once(self) -> bool:
        """Push what is pending; returns True when that was a full sync. Raises ServiceUnavailable
        after putting back everything it did not get accepted."""
        with self._lock:
            self._pushing = True
            full, since = self._full_needed, self._full_since
            if full:
                # The full state carries every pending change: the dirty set is spent.
                dirty_at_snapshot = dict(self._dirty)
                self._dirty.clear()
                self._full_needed, self._full_since = False, None
            else:
                batch = dict(self._dirty)
                self._dirty.clear()
        try:
            if full:
                self._push_full(since, dirty_at_snapshot)
                return True
            self._push_incremental(batch)
            return False
        finally:
            with self._lock:
                self._pushing = False

    def snapshot(self) -> dict:
        def objects(plural: str) -> list[dict]:
            informer = self.informers.get(plural)
            return sorted(informer.items(), key=lambda o: o["metadata"]["name"]) if informer else []
        return {
            "resourceSlices": objects(SLICES),
            "nodes": [node_body(n) for n in objects("nodes")],
            "deviceClasses": objects(CLASSES),
            "deviceTaintRules": objects(TAINT_RULES),
        }

    def _push_full(self, since: float | None, dirty_at_snapshot: dict) -> None:
        state = self.snapshot()
        started = time.monotonic()
        excluded: list[tuple[str, str]] = []
        while True:
            try:
                self.service.put_inventory(state)
                break
            except ServiceUnavailable:
                with self._lock:
                    oldest = min([t for t in [since, *dirty_at_snapshot.values()] if t is not None], default=None)
                    self._require_full(oldest)
                metrics.PUSHES.labels("full", "retry").inc()
                raise
            except ServiceRejected as exc:
                metrics.ERRORS.labels("service").inc()
                self.last_error = str(exc)
                # Pushes are atomic: one object the service refuses (say a field from a newer Kubernetes
                # than it knows) rejects the whole state. The problem's field paths name the objects; push
                # the state without them, so everything else - deletions included - still gets through.
                dropped = _drop_rejected(state, exc.problem)
                if not dropped or len(excluded) > 1000:
                    metrics.PUSHES.labels("full", "rejected").inc()
                    self._full_rejected(exc)
                    return
                excluded += dropped
                for what, reason in dropped:
                    log.error("%s REJECTED by the service and left out of the full sync: %s", what, reason)
        metrics.PUSHES.labels("full", "ok").inc()
        self.last_full_sync = time.time()
        metrics.LAST_FULL_SYNC.set(self.last_full_sync)
        log.info("full sync pushed: %d resourceslices, %d nodes, %d deviceclasses, %d devicetaintrules in %.2fs%s",
                 len(state["resourceSlices"]), len(state["nodes"]), len(state["deviceClasses"]),
                 len(state["deviceTaintRules"]), time.monotonic() - started,
                 f" ({len(excluded)} rejected object(s) left out)" if excluded else "")

    def _full_rejected(self, exc: ServiceRejected) -> None:
        """The service refused the state without saying which object: push objects one by one instead
        (each good one gets in), and try the full sync again at the next period."""
        log.error("full sync REJECTED by the service (%s); pushing the cluster's objects one by one instead "
                  "and retrying the full sync in %.0fs", exc, self.resync_period)
        with self._lock:
            for plural in (SLICES, "nodes"):
                for obj in (self.informers[plural].items() if plural in self.informers else []):
                    self._dirty.setdefault((plural, obj["metadata"]["name"]), time.monotonic())
        self._wake.set()

    def _push_incremental(self, batch: dict[tuple[str, str], float]) -> None:
        if not batch:
            return
        done = 0
        items = sorted(batch.items(), key=lambda kv: kv[1])
        for index, ((plural, name), _since) in enumerate(items):
            kind = "slice" if plural == SLICES else "node"
            obj = self.informers[plural].get(name)
            try:
                if obj is None:
                    (self.service.delete_slice if plural == SLICES else self.service.delete_node)(name)
                    action = "deleted"
                elif plural == SLICES:
                    self.service.put_slice(name, obj)
                    action = "upserted"
                else:
                    self.service.put_node(name, node_body(obj))
                    action = "upserted"
                metrics.PUSHES.labels(kind, "ok").inc()
                done += 1
                log.debug("%s %s %s", kind, name, action)
            except ServiceUnavailable:
                # Put this and every later key back, keeping their original times (for the lag) unless
                # the informer has already re-marked them.
                with self._lock:
                    for key, since in items[index:]:
                        self._dirty[key] = min(since, self._dirty.get(key, since))
                metrics.PUSHES.labels(kind, "retry").inc()
                raise
            except ServiceRejected as exc:
                metrics.PUSHES.labels(kind, "rejected").inc()
                metrics.ERRORS.labels("service").inc()
                self.last_error = str(exc)
                log.error("%s %s REJECTED by the service, not retried until it changes: %s", kind, name, exc)
        log.info("pushed %d change(s) (%s)", done, _summary(batch))

    # -- service health, as the operator sees it --------------------------------------------------
    def _service_down(self, exc: ServiceUnavailable) -> None:
        metrics.ERRORS.labels("service").inc()
        self.last_error = str(exc)
        delay = self.backoff.next_delay()
        if self.service_down_since is None:
            self.service_down_since = time.monotonic()
            log.warning("service unavailable (%s); keeping %d pending change(s), retrying with backoff",
                        exc, self.pending())
        log.info("retrying the push in %.1fs (attempt %d, %d change(s) pending)",
                 delay, self.backoff.failures, self.pending())
        self.stop.wait(delay)
        self._wake.set()

    def _service_up(self) -> None:
        self.backoff.reset()
        if self.service_down_since is not None:
            log.warning("service reachable again after %.0fs; pending changes pushed",
                        time.monotonic() - self.service_down_since)
            self.service_down_since = None

    def _update_gauges(self) -> None:
        metrics.SYNC_LAG.set(self.lag())
        with self._lock:
            metrics.PENDING_CHANGES.set(len(self._dirty))


_FIELD = re.compile(r"^(resourceSlices|nodes|deviceClasses|deviceTaintRules)\[(\d+)\]")


def _drop_rejected(state: dict, problem: dict) -> list[tuple[str, str]]:
    """Remove from ``state`` the objects that the problem's ``errors[].field`` paths point at.

    Returns ("<kind> <name>", reason) for each; empty when an error cannot be pinned on one object (then
    nothing is removed, as a partial guess could drop good objects)."""
    hits: dict[tuple[str, int], str] = {}
    for err in problem.get("errors") or []:
        match = _FIELD.match(str((err or {}).get("field") or ""))
        if not match or int(match.group(2)) >= len(state.get(match.group(1)) or []):
            return []
        hits.setdefault((match.group(1), int(match.group(2))), f"{err.get('field')}: {err.get('reason')}")
    dropped = []
    for (key, index), reason in sorted(hits.items(), reverse=True):  # highest index first: indices stay valid
        obj = state[key].pop(index)
        name = obj.get("name") or (obj.get("metadata") or {}).get("name")
        dropped.append((f"{key[:-1]} {name}", reason))
    return dropped


def _summary(batch: dict) -> str:
    counts: dict[str, int] = {}
    for plural, _ in batch:
        counts[plural] = counts.get(plural, 0) + 1
    return ", ".join(f"{n} {p}" for p, n in sorted(counts.items()))
