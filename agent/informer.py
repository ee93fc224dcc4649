"""List-then-watch of one resource, with a local cache: the agent's view of the cluster.

The loop is the one client-go's reflector runs:

1. LIST (all pages, one snapshot) and replace the cache atomically; report what differs from the
   previous cache, so objects deleted while the agent was not watching are noticed too;
2. WATCH from the list's resourceVersion with bookmarks; each event updates the cache and the
   resourceVersion (BOOKMARKs move the resourceVersion without an object);
3. when the server ends the watch (its timeout), watch again from the last resourceVersion: no relist;
4. on 410 Gone (history compacted past our resourceVersion) go back to 1 at once;
5. on any other failure, back off and retry the watch from the same resourceVersion (a relist follows
   only if that resourceVersion has meanwhile expired).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from agent import metrics
from agent.backoff import Backoff
from agent.kube import KubeClient, Resource, WatchExpired, WatchFailed

log = logging.getLogger("agent.informer")

# on_change(key, old, new): new is None when the object was deleted, old is None when it is new.
ChangeHandler = Callable[[str, "dict | None", "dict | None"], None]


def object_key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def slim(obj: dict) -> dict:
    """Drop what nobody downstream reads (managedFields are often half an object's size)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    if "kubectl.kubernetes.io/last-applied-configuration" in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items()
                               if k != "kubectl.kubernetes.io/last-applied-configuration"}
    return {**obj, "metadata": meta}


class Informer:
    """Keeps ``cache`` equal to the cluster's objects of one resource and reports every change."""

    def __init__(self, kube: KubeClient, resource: Resource, on_change: ChangeHandler, stop: threading.Event,
                 *, transform: Callable[[dict], dict] = slim, watch_timeout: int = 300,
                 on_synced: Callable[[], None] | None = None, backoff: Backoff | None = None):
        self.kube = kube
        self.resource = resource
        self.on_change = on_change
        self.on_synced = on_synced
        self.transform = transform
        self.watch_timeout = watch_timeout
        self.stop = stop
        self.backoff = backoff or Backoff(base=0.5, cap=30.0)
        self.lock = threading.Lock()
        self.cache: dict[str, dict] = {}
        self.resource_version = ""
        self.synced = threading.Event()  # set after the first complete list
        self.thread: threading.Thread | None = None
        self._watch_events = 0  # object events in the current watch (bookmarks excluded)

    @property
    def name(self) -> str:
        return self.resource.plural

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self.thread.start()

    def get(self, key: str) -> dict | None:
        with self.lock:
            return self.cache.get(key)

    def items(self) -> list[dict]:
        with self.lock:
            return list(self.cache.values())

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        need_list, reason = True, "start"
        while not self.stop.is_set():
            self._watch_events = 0
            try:
                if need_list:
                    self._relist(reason)
                    need_list = False
                started = time.monotonic()
                self._watch()
                # A watch that the server ended after a while is normal; one that ends at once, again
                # and again, is a server in trouble and must not become a tight loop.
                if self._watch_events or time.monotonic() - started > 1.0:
                    self.backoff.reset()
                else:
                    self.stop.wait(self.backoff.next_delay())
            except Exception as exc:  # noqa: BLE001 - any failure: back off, keep the cache, try again
                if self.stop.is_set():
                    break
                expired = isinstance(exc, WatchExpired) or (isinstance(exc, ApiException) and exc.status == 410)
                if expired:
                    log.info("%s: watch from resourceVersion %s expired (%s); listing again",
                             self.name, self.resource_version, exc)
                    if reason == "expired" and not need_list and not self._watch_events:
                        # Expired again straight after a list: a server that cannot serve its own
                        # list's resourceVersion. Relisting in a tight loop would only add load.
                        self.stop.wait(self.backoff.next_delay())
                    need_list, reason = True, "expired"
                    continue
                stage = "list" if need_list else "watch"
                metrics.ERRORS.labels(stage).inc()
                delay = self.backoff.next_delay()
                log.warning("%s: %s failed (%s); retrying in %.1fs", self.name, stage, _describe(exc), delay)
                if need_list:
                    reason = "error"
                self.stop.wait(delay)
        log.debug("%s: informer stopped", self.name)

    def _relist(self, reason: str) -> None:
        started = time.monotonic()
        items, resource_version = self.kube.list(self.resource)
        fresh = {object_key(obj): self.transform(obj) for obj in items}
        # Swap the whole cache at once: readers never see half of a list.
        with self.lock:
            previous, self.cache = self.cache, fresh
            self.resource_version = resource_version
        metrics.RELISTS.labels(self.name, reason).inc()
        changed = 0
        for key in previous.keys() | fresh.keys():
            old, new = previous.get(key), fresh.get(key)
            if old is None or new is None or _rv(old) != _rv(new):
                changed += 1
                self.on_change(key, old, new)
        log.info("%s: listed %d objects at resourceVersion %s in %.2fs (%s; %d changed since the last list)",
                 self.name, len(fresh), resource_version, time.monotonic() - started, reason, changed)
        if not self.synced.is_set():
            self.synced.set()
            if self.on_synced:
                self.on_synced()

    def _watch(self) -> None:
        # Randomised like client-go, so the watches of many agents do not all restart together.
        timeout = int(self.watch_timeout * random.uniform(1.0, 2.0))
        for event in self.kube.watch(self.resource, self.resource_version, timeout):
            if self.stop.is_set():
                break
            kind = event.get("type")
            obj = event.get("object") or {}
            metrics.WATCH_EVENTS.labels(self.name, kind or "unknown").inc()
            rv = _rv(obj)
            if kind == "BOOKMARK":
                # No object change, but a newer resourceVersion to resume from: a later watch need not
                # replay (or 410 on) history we have already seen.
                if rv:
                    self.resource_version = rv
                continue
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                log.warning("%s: ignoring unknown watch event type %r", self.name, kind)
                continue
            key = object_key(obj)
            with self.lock:
                old = self.cache.get(key)
                new = None
                if kind == "DELETED":
                    self.cache.pop(key, None)
                else:
                    if obj.get("apiVersion") is None:
                        obj["apiVersion"], obj["kind"] = self.resource.api_version, self.resource.kind
                    new = self.cache[key] = self.transform(obj)
                if rv:
                    self.resource_version = rv
            self._watch_events += 1
            log.debug("%s: %s %s (resourceVersion %s)", self.name, kind, key, rv)
            self.on_change(key, old, new)


def _rv(obj: dict | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        if exc.status == 403:
            return ("HTTP 403 Forbidden: the agent's ClusterRole must allow list and watch here "
                    "(see deploy/agent/agent.yaml)")
        return f"HTTP {exc.status} {exc.reason}"
    if isinstance(exc, WatchFailed):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
