"""Claim write-back: ResourceClaims marked for draservice are allocated by the service, not the scheduler.

The convention (documented in the README):

* a ResourceClaim annotated ``draservice.io/allocate: "true"`` is mirrored to the service, into the
  service namespace of the same name (or the one in ``draservice.io/namespace``), as claim
  ``<cluster>.<name>``, pinned to this cluster (``draservice.io/allowed-clusters: name=<cluster>``);
* the agent adds the finalizer ``draservice.io/release`` to the claim, so that deleting it in the cluster
  waits until the agent has released it in the service - a deletion can't be missed, even one made while
  the agent was down;
* when the service has allocated the claim, the agent writes ``status.allocation`` (exactly the service's
  AllocationResult) to the cluster's claim through the status subresource, conditional on the
  resourceVersion it read: a 409 Conflict means someone else wrote first, so it re-reads and tries again;
* ``reservedFor`` is left to Kubernetes (the scheduler reserves an allocated claim for each pod it
  schedules with it), except that pod reservations recorded in the service are copied over;
* deleting the claim, or removing the annotation, releases it in the service and drops the finalizer;
* a claim the service is taking back (condition ``Releasing``: a preemption victim, to stop by
  ``status.preemption.stopBy``) is watched: once the cluster's ``reservedFor`` is empty, no pod uses its devices
  and the agent says so (``POST .../release-confirm`` with that ``reservedFor``), and the service hands them over
  at once instead of at ``forceAt``; once the service has requeued it, the cluster's allocation is removed (unless
  pods still hold it: forced) and the claim waits to be allocated again.

Reconciliation is level-triggered: every change to a claim (from the watch) queues its key, and the
claims thread brings cluster and service into agreement from their current states. Claims the service
has not decided yet wait in a set; every ``poll_interval`` one list request
(``GET /api/v1/resourceclaims?labelSelector=draservice.io/source-cluster=<cluster>``) shows which of them
have moved on, so a hundred pending claims cost one request per interval, not a hundred. The same list,
every ``sweep_period``, finds service claims whose cluster claim is gone (a finalizer removed by hand)
and releases them.

Nothing is mirrored before the inventory's first full sync has been accepted: the service refuses
claims that name a DeviceClass it has not heard of, and the cluster's DeviceClasses arrive with it.
"""
from __future__ import annotations

import copy
import hashlib
import heapq
import logging
import threading
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from agent import metrics
from agent.backoff import Backoff
from agent.informer import Informer
from agent.kube import KubeClient, Resource
from agent.service import ServiceClient, ServiceError, ServiceRejected, ServiceUnavailable

log = logging.getLogger("agent.claims")

MARK = "draservice.io/allocate"
NAMESPACE_OVERRIDE = "draservice.io/namespace"
FINALIZER = "draservice.io/release"
SOURCE_UID = "draservice.io/source-uid"
SOURCE_CLAIM = "draservice.io/source-claim"
SOURCE_CLUSTER = "draservice.io/source-cluster"
ALLOWED_CLUSTERS = "draservice.io/allowed-clusters"
PREFERRED_CLUSTER = "draservice.io/preferred-cluster"
MAX_CONFLICT_RETRIES = 5


def is_marked(claim: dict) -> bool:
    return str(((claim.get("metadata") or {}).get("annotations") or {}).get(MARK, "")).lower() == "true"


def service_name(cluster: str, name: str) -> str:
    """``<cluster>.<name>``: unique across clusters sharing a namespace, still a DNS subdomain; hashed
    down when it would pass the 253-character limit."""
    full = f"{cluster}.{name}"
    if len(full) <= 253:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[:242]}-{digest}"


class ClaimSync:
    def __init__(self, kube: KubeClient, service: ServiceClient, resource: Resource, stop: threading.Event,
                 *, poll_interval: float = 2.0, sweep_period: float = 60.0, watch_timeout: int = 300,
                 backoff_cap: float = 60.0, ready: Callable[[], bool] = lambda: True):
        self.kube = kube
        self.service = service
        self.cluster = service.cluster
        self.resource = resource
        self.stop = stop
        self.poll_interval = poll_interval
        self.sweep_period = sweep_period
        self.ready = ready
        self.backoff = Backoff(base=1.0, cap=backoff_cap)
        self.informer = Informer(kube, resource, self._on_change, stop, watch_timeout=watch_timeout)
        self._lock = threading.Condition()
        self._queue: list[tuple[float, str]] = []  # (due, key) heap
        self._due: dict[str, float] = {}  # key -> earliest due time queued
        self._mirrored: dict[str, tuple[str, str]] = {}  # cluster key -> (service namespace, service name)
        self._reported: dict[str, str] = {}  # key -> last outcome logged (log each state once, not per poll)
        self._waiting: set[str] = set()  # keys whose service claim is still Pending
        self._confirmed: set[str] = set()  # keys whose release this agent confirmed (once per notice)
        self.last_error: str | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.informer.start()
        self.thread = threading.Thread(target=self.run, name="claims", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def mirrored_count(self) -> int:
        return len(self._mirrored)

    # -- queue ------------------------------------------------------------------------------------
    def _on_change(self, key: str, old: dict | None, new: dict | None) -> None:
        obj = new or old or {}
        if is_marked(obj) or FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or []) \
                or key in self._mirrored:
            self.enqueue(key)

    def enqueue(self, key: str, delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        with self._lock:
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._queue, (due, key))
            self._lock.notify()

    def _next(self, timeout: float) -> str | None:
        """The next key that is due, waiting at most ``timeout`` seconds for one."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self.stop.is_set():
                now = time.monotonic()
                while self._queue and self._due.get(self._queue[0][1]) != self._queue[0][0]:
                    heapq.heappop(self._queue)  # superseded by an earlier entry for the same key
                if self._queue and self._queue[0][0] <= now:
                    _, key = heapq.heappop(self._queue)
                    del self._due[key]
                    return key
                if now >= deadline:
                    return None
                wake = min(deadline, self._queue[0][0]) if self._queue else deadline
                self._lock.wait(timeout=min(1.0, wake - now))
        return None

    def run(self) -> None:
        self.informer.synced.wait()
        while not self.ready():
            if self.stop.wait(0.2):
                return
        log.info("claim write-back running: claims annotated %s=\"true\" are allocated by the service", MARK)
        next_poll = next_sweep = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            # Mirrored claims are listed too: one of them may be a preemption victim now, to watch (``_releasing``).
            if now >= next_poll and (self._waiting or self._mirrored or now >= next_sweep):
                try:
                    self._poll_service(sweep=now >= next_sweep)
                    if now >= next_sweep:
                        next_sweep = now + self.sweep_period
                except Exception as exc:  # noqa: BLE001 - the next poll tries again
                    metrics.ERRORS.labels("claims").inc()
                    self.last_error = f"listing the service's claims: {exc}"
                    log.warning("claims: cannot list this cluster's claims in the service: %s", _short(exc))
                next_poll = now + self.poll_interval
            key = self._next(timeout=max(0.0, next_poll - time.monotonic()))
            if key is None:
                continue
            try:
                again = self.reconcile(key)
                self.backoff.reset()
            except ServiceRejected as exc:
                # Refused as it is - e.g. a DeviceClass the service has not received yet. A claim's spec is
                # immutable, so only a slow retry makes sense; it is logged once.
                metrics.ERRORS.labels("claims").inc()
                self.last_error = f"claim {key}: {exc}"
                self._report(key, "rejected", logging.ERROR, "claim %s: REJECTED by the service: %s", key, exc)
                again = max(30.0, self.poll_interval * 15)
            except (ServiceUnavailable, ApiException, OSError) as exc:
                metrics.ERRORS.labels("claims").inc()
                self.last_error = f"claim {key}: {exc}"
                again = self.backoff.next_delay()
                log.warning("claim %s: %s; retrying in %.1fs", key, _short(exc), again)
            except Exception:  # noqa: BLE001 - a bug in one claim must not end the write-back for all
                metrics.ERRORS.labels("claims").inc()
                again = self.backoff.next_delay()
                log.exception("claim %s: unexpected error; retrying in %.1fs", key, again)
            if again is not None:
                self.enqueue(key, again)

    def _poll_service(self, sweep: bool) -> None:
        """One list of the claims mirrored from this cluster: requeue the waiting ones the service has
        decided, and (``sweep``) release those whose cluster claim no longer exists."""
        remote = self.service.list_claims(label_selector=f"{SOURCE_CLUSTER}={self.cluster}")
        by_key = {}
        item: dict | None
        for item in remote:
            annotations = (item.get("metadata") or {}).get("annotations") or {}
            if annotations.get(SOURCE_CLUSTER) == self.cluster and annotations.get(SOURCE_CLAIM):
                by_key[annotations[SOURCE_CLAIM]] = item
        for key in list(self._waiting):
            item = by_key.get(key)
            if item is None or (item.get("status") or {}).get("phase", "Pending") != "Pending":
                self._waiting.discard(key)
                self.enqueue(key)
        for key, item in by_key.items():
            status = item.get("status") or {}
            if key not in self._mirrored:
                continue
            if _releasing(status) and key not in self._confirmed:
                self.enqueue(key)  # a victim now: watch its reservedFor
            elif status.get("phase") == "Pending" and status.get("preemption") \
                    and ((self.informer.get(key) or {}).get("status") or {}).get("allocation"):
                self.enqueue(key)  # requeued by the preemption: the cluster's allocation is taken back
        if not sweep:
            return
        for key, item in by_key.items():
            claim = self.informer.get(key)
            uid = (item["metadata"].get("annotations") or {}).get(SOURCE_UID)
            meta = item["metadata"]
            if claim is None or (uid and claim["metadata"].get("uid") != uid):
                self._release(key, meta["namespace"], meta["name"], why="its cluster claim no longer exists")
            elif (meta["namespace"], meta["name"]) != self._target(claim):
                # The claim now maps elsewhere (its draservice.io/namespace annotation changed): this copy is
                # stale and would hold devices alongside the new one.
                self.service.release_claim(meta["namespace"], meta["name"])
                log.info("claim %s: released its old copy %s/%s in the service", key, meta["namespace"], meta["name"])
            elif (item.get("status") or {}).get("phase") in ("Released", "Failed") \
                    and (claim.get("status") or {}).get("allocation"):
                self.enqueue(key)  # the service took back what the cluster still holds

    # -- reconcile one claim ----------------------------------------------------------------------
    def reconcile(self, key: str) -> float | None:
        """Bring one claim into agreement; returns seconds until it should be looked at again, or None."""
        claim = self.informer.get(key)
        if claim is None:
            # Gone from the cluster without our finalizer (removed by hand, or the claim was never ours).
            if key in self._mirrored:
                self._release(key, *self._mirrored[key], why="deleted in the cluster")
            return None
        meta = claim["metadata"]
        finalizers = meta.get("finalizers") or []
        self._waiting.discard(key)  # looked at now; re-added below if still pending
        if meta.get("deletionTimestamp") or not is_marked(claim):
            if FINALIZER in finalizers:
                why = "deleted in the cluster" if meta.get("deletionTimestamp") else "no longer marked"
                self._release(key, *self._target(claim), why=why)
                self._drop_finalizer(claim)
            self._mirrored.pop(key, None)
            return None
        if FINALIZER not in finalizers:
            claim = self._add_finalizer(claim)
            if claim is None:
                return 0.5  # changed under us; the watch has the new version by then
        ns, name = self._target(claim)
        self._mirrored[key] = (ns, name)
        remote = self.service.get_claim(ns, name)
        if remote is not None and _source_uid(remote) not in (None, meta.get("uid")):
            # A previous claim of the same name (deleted while its finalizer was removed by hand).
            self._release(key, ns, name, why="left over from an earlier claim of the same name")
            remote = None
        allocated_here = (claim.get("status") or {}).get("allocation")
        if remote is None and allocated_here:
            # Allocated in the cluster by someone else (the scheduler got there first): nothing to mirror.
            self._report(key, "foreign", logging.WARNING, "claim %s: allocated in the cluster, not by the service; "
                         "not mirrored (remove the %s annotation to silence this)", key, MARK)
            return None
        if remote is None:
            # Keyed by uid and resourceVersion: a retried create replays, but a claim unmarked and marked
            # again (a new resourceVersion) really is created again.
            remote = self.service.create_claim(ns, self._mirror_body(claim, name),
                                               idempotency_key=f"{meta.get('uid')}/{meta.get('resourceVersion')}")
            log.info("claim %s: mirrored to the service as %s/%s", key, ns, name)
        return self._follow(key, claim, remote)

    def _follow(self, key: str, claim: dict, remote: dict) -> float | None:
        status = remote.get("status") or {}
        phase = status.get("phase") or ("Allocated" if status.get("allocation") else "Pending")
        allocated_here = (claim.get("status") or {}).get("allocation")
        if allocated_here:
            if phase == "Allocated" and _devices(status.get("allocation")) == _devices(allocated_here):
                if _releasing(status):
                    self._report_reserved(key, claim)
                return None  # written back already: nothing left to do until it is deleted (or preempted)
            if phase == "Pending" and status.get("preemption"):
                # Requeued by a preemption: its devices are another claim's now. Taken back from the cluster's
                # claim (kept, and said loudly, if pods still hold it: it was forced), then it waits again.
                self._confirmed.discard(key)
                self._revoke(key, claim, "preempted", status)
                self._waiting.add(key)
                return None
            if phase in ("Pending", "Allocated"):
                # The cluster's own allocation (made by the scheduler) is the one the kubelet uses; the
                # service must not keep other devices held for this claim.
                self._release(key, *self._target(claim), why="allocated in the cluster by someone else")
                self._report(key, "foreign", logging.WARNING, "claim %s: allocated in the cluster, not by the "
                             "service; the service's copy was released", key)
                return None
            # Released or Failed in the service (a lease ran out, an admin released it) while the cluster
            # still holds the devices: the service may hand them to someone else now.
            self._revoke(key, claim, phase, status)
            return None
        if phase == "Allocated":
            if status.get("cluster") not in (None, "", self.cluster):
                self._report(key, "elsewhere", logging.ERROR, "claim %s: the service allocated it on cluster %r, "
                             "not %r; not written back", key, status.get("cluster"), self.cluster)
                return None
            self._write_back(key, claim, remote)
            return None
        if phase == "Pending":
            reason = status.get("reason") or next((c.get("reason") for c in status.get("conditions") or []
                                                   if c.get("reason")), "")
            self._report(key, f"pending:{reason}", logging.INFO,
                         "claim %s: pending in the service%s", key, f" ({reason})" if reason else "")
            self._waiting.add(key)  # the next poll requeues it once the service has decided
            return None
        self._report(key, phase, logging.WARNING, "claim %s: the service reports it %s (%s); delete and re-create "
                     "the claim to try again", key, phase, status.get("message") or status.get("reason") or "no reason")
        return None

    def _report_reserved(self, key: str, claim: dict) -> None:
        """A victim being released: tell the service once the cluster's claim is reserved for no pod (each change
        of the claim brings it here again)."""
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        if reserved:
            self._report(key, "releasing-in-use", logging.INFO, "claim %s: preempted in the service; still reserved "
                         "for %d pod(s): its devices are kept until they stop or until forceAt", key, len(reserved))
            return
        self.service.report_reserved_for(*self._target(claim), [])
        self._confirmed.add(key)
        self._report(key, "release-confirmed", logging.INFO, "claim %s: preempted in the service; no pod uses it any "
                     "more, its devices are handed over", key)

    def _revoke(self, key: str, claim: dict, phase: str, status: dict) -> None:
        """Take back an allocation the service no longer stands behind - unless a pod already uses it."""
        ref = claim["metadata"]
        for _ in range(MAX_CONFLICT_RETRIES):
            if (claim.get("status") or {}).get("reservedFor"):
                self._report(key, f"revoked-in-use:{phase}", logging.ERROR,
                             "claim %s: %s in the service but still reserved for pods in the cluster; the allocation "
                             "is kept and the service may give these devices to others (%s)", key, phase,
                             status.get("reason") or "no reason given")
                return
            body = copy.deepcopy(claim)
            body["status"].pop("allocation", None)
            try:
                self.kube.replace_status(self.resource, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                metrics.CLAIM_CONFLICTS.inc()
                claim = self.kube.get(self.resource, ref["name"], ref["namespace"])
                continue
            metrics.CLAIM_WRITEBACKS.labels("revoked").inc()
            self._report(key, f"revoked:{phase}", logging.WARNING, "claim %s: %s in the service (%s); its allocation "
                         "was removed from the cluster's claim", key, phase, status.get("reason") or "no reason given")
            return
        raise ApiException(status=409, reason="revoking the allocation kept conflicting")

    def _write_back(self, key: str, claim: dict, remote: dict) -> None:
        status = remote["status"]
        for attempt in range(1, MAX_CONFLICT_RETRIES + 1):
            body = copy.deepcopy(claim)
            body.setdefault("status", {})["allocation"] = copy.deepcopy(status["allocation"])
            reserved = _merge_reserved(body["status"].get("reservedFor") or [], status.get("reservedFor") or [])
            if reserved:
                body["status"]["reservedFor"] = reserved
            try:
                self.kube.replace_status(self.resource, body)
            except ApiException as exc:
                if exc.status == 409:
                    metrics.CLAIM_CONFLICTS.inc()
                    log.info("claim %s: conflict writing status (attempt %d), re-reading", key, attempt)
                    claim = self.kube.get(self.resource, claim["metadata"]["name"], claim["metadata"]["namespace"])
                    if claim["metadata"].get("deletionTimestamp") or (claim.get("status") or {}).get("allocation"):
                        self.enqueue(key)  # deleted, or allocated meanwhile: let reconcile decide afresh
                        return
                    continue
                if exc.status == 404:
                    return  # deleted: its DELETED/finalizer path releases it
                if exc.status == 422:
                    metrics.CLAIM_WRITEBACKS.labels("invalid").inc()
                    self._report(key, "invalid", logging.ERROR, "claim %s: the API server refused the allocation: "
                                 "%s", key, _short(exc))
                    return
                raise
            metrics.CLAIM_WRITEBACKS.labels("ok").inc()
            devices = [f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
                       for r in ((status["allocation"].get("devices") or {}).get("results") or [])]
            shown = ", ".join(devices[:4]) + (f" and {len(devices) - 4} more" if len(devices) > 4 else "")
            self._report(key, "written", logging.INFO, "claim %s: allocation written back (node %s: %s)", key,
                         status.get("node") or "-", shown or "no devices")
            return
        metrics.CLAIM_WRITEBACKS.labels("conflict").inc()
        raise ApiException(status=409, reason=f"still conflicting after {MAX_CONFLICT_RETRIES} attempts")

    # -- helpers ----------------------------------------------------------------------------------
    def _target(self, claim: dict) -> tuple[str, str]:
        meta = claim["metadata"]
        ns = (meta.get("annotations") or {}).get(NAMESPACE_OVERRIDE) or meta["namespace"]
        return ns, service_name(self.cluster, meta["name"])

    def _mirror_body(self, claim: dict, name: str) -> dict:
        meta = claim["metadata"]
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k not in (MARK, NAMESPACE_OVERRIDE, "kubectl.kubernetes.io/last-applied-configuration")}
        annotations.update({
            ALLOWED_CLUSTERS: f"name={self.cluster}",  # the devices must be this cluster's
            PREFERRED_CLUSTER: self.cluster,
            SOURCE_CLUSTER: self.cluster,
            SOURCE_CLAIM: f"{meta['namespace']}/{meta['name']}",
            SOURCE_UID: meta.get("uid", ""),
        })
        # The label lets one list request find every claim mirrored from this cluster.
        labels = {**(meta.get("labels") or {}), SOURCE_CLUSTER: self.cluster}
        return {"apiVersion": claim.get("apiVersion") or self.resource.api_version, "kind": "ResourceClaim",
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": claim.get("spec") or {}}

    def _release(self, key: str, ns: str, name: str, why: str) -> None:
        self.service.release_claim(ns, name)
        self._mirrored.pop(key, None)
        self._waiting.discard(key)
        self._reported.pop(key, None)
        log.info("claim %s: released %s/%s in the service (%s)", key, ns, name, why)

    def _add_finalizer(self, claim: dict) -> dict | None:
        body = copy.deepcopy(claim)
        body["metadata"]["finalizers"] = (body["metadata"].get("finalizers") or []) + [FINALIZER]
        try:
            return self.kube.replace(self.resource, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                metrics.CLAIM_CONFLICTS.inc()
                return None
            raise

    def _drop_finalizer(self, claim: dict) -> None:
        for _ in range(MAX_CONFLICT_RETRIES):
            body = copy.deepcopy(claim)
            body["metadata"]["finalizers"] = [f for f in body["metadata"].get("finalizers") or [] if f != FINALIZER]
            try:
                self.kube.replace(self.resource, body)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
                metrics.CLAIM_CONFLICTS.inc()
                claim = self.kube.get(self.resource, claim["metadata"]["name"], claim["metadata"]["namespace"])
                if FINALIZER not in (claim["metadata"].get("finalizers") or []):
                    return
        raise ApiException(status=409, reason="finalizer removal kept conflicting")

    def _report(self, key: str, state: str, level: int, msg: str, *args) -> None:
        if self._reported.get(key) != state:
            self._reported[key] = state
            log.log(level, msg, *args)


def _devices(allocation: dict | None) -> set[tuple]:
    """What an allocation hands out. Compared instead of the whole object, which the API server may have
    normalized (quantities, defaults) on the way in."""
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return {(r.get("request"), r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID")) for r in results}


def _releasing(status: dict) -> bool:
    """The service is taking the claim back from a preemption and nobody has confirmed that it stopped yet."""
    return bool(status.get("preemption")) and not status["preemption"].get("confirmedAt") and any(
        c.get("type") == "Releasing" and c.get("status") == "True" for c in status.get("conditions") or [])


def _source_uid(remote: dict) -> str | None:
    return ((remote.get("metadata") or {}).get("annotations") or {}).get(SOURCE_UID)


def _merge_reserved(existing: list[dict], from_service: list[dict]) -> list[dict]:
    """The cluster's reservations plus the service's pod reservations (other consumers have no meaning
    in the cluster), deduplicated by uid, at most 256 as the API allows."""
    out = list(existing)
    seen = {r.get("uid") for r in out}
    for r in from_service:
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid") and r["uid"] not in seen:
            out.append({"resource": "pods", "name": r.get("name"), "uid": r["uid"]})
            seen.add(r["uid"])
    return out[:256]


def _short(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    if isinstance(exc, ServiceError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
