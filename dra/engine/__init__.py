"""The matching engine: Kubernetes DRA structured allocation (resource.k8s.io/v1), fleet-wide.

Pure Python: no Django, no database. Everything the rest of the product needs is importable from here.

Contract
--------
Inputs are Kubernetes JSON dicts wrapped in small dataclasses (``dra.engine.types``):

* ``FleetSnapshot(clusters=[ClusterInventory(...)], device_classes=[v1 DeviceClass...])``; each
  ``ClusterInventory`` holds ``name``, ``labels``, ``stale``, ``nodes`` (``[{"name", "labels"}]``),
  ``resource_slices`` (normalized v1 ResourceSlice JSON), ``device_taint_rules`` (v1 DeviceTaintRule JSON)
  and ``device_classes`` (cluster-specific classes that override fleet classes of the same name).
* ``AllocatedDevice(cluster, driver, pool, device, share_id=None, consumed_capacity=None)``: devices in use.
* ``ClaimGroup(claims=[v1 ResourceClaim...], allowed_clusters=None, preferred_cluster=None, node=None,
  key="")``: one consumer's claims, allocated together or not at all. Claims must already be defaulted and
  validated (``dra.k8s.claims.default_claim`` / ``validate_claim``); the engine re-checks what it relies on.

``Engine(snapshot, allocated, features=None, budget=None)`` is long-lived: build it once per snapshot and call
``allocate(group) -> GroupOutcome`` many times. Each success updates the engine's own in-use state, so the next
group sees those devices as taken; ``release(devices)`` gives devices back and ``commit(devices)`` marks devices
that were allocated elsewhere (another worker) as in use. Indexes (free devices per node and selector set,
memoized CEL selector results, failures per claim shape and node version) are built lazily and updated
incrementally. An engine is not thread-safe: one thread at a time.

``GroupOutcome`` (``to_dict()`` is JSON-safe):

* success: ``allocated=True``, ``cluster``, ``node`` (``None`` when only network-attached devices were used),
  ``claims=[ClaimOutcome(name, namespace, uid, allocation=<v1 AllocationResult dict>)]`` in input order, and
  ``devices=[AllocatedDevice...]`` to persist. An ``AllocationResult`` holds ``devices.results``
  (``request, driver, pool, device`` and, where they apply, ``adminAccess``, ``tolerations``,
  ``bindingConditions``, ``bindingFailureConditions``, ``shareID``, ``consumedCapacity``), ``devices.config``
  (class configs, then claim configs, each once) and ``nodeSelector`` (built as upstream does it).
* failure: ``allocated=False``, ``reason`` (a ``Reason`` code: ``unsatisfiable``, ``search_budget_exceeded``,
  ``no_eligible_cluster``, ``invalid_pools``, ``selector_error_on_all_candidates``), ``message`` (a one-line
  summary) and structured ``diagnostics``
  (``dra.engine.diagnostics``): per request and ``firstAvailable`` alternative the devices considered, the
  count dropped at each check (class selector, request selector, CEL error, taint, allocated, counters,
  capacity, node mismatch, pool incomplete/invalid, cluster stale), the devices available and the best nodes,
  the nearest miss per request selector; per examined node why it failed; unusable pools; ineligible clusters.
  The per-device part of an explanation has a budget: past it the devices left are counted as ``not_examined``
  and the explanation and the request say ``"sampled": true`` (``dra.engine.explain_walk``).
* input errors (unknown class, CEL compile error, limits, ``All`` over an incomplete pool, a feature
  in use but disabled, invalid pools when nothing else fits) raise ``AllocationError`` with the upstream
  wording; ``allocate(group, raise_errors=False)`` returns them as ``GroupOutcome.error`` instead. Errors that
  belong to one node (``All`` over an incomplete pool, invalid pools) only surface when the group is pinned to
  that node or every examined node failed with an error. A CEL runtime error on a device is not an error of
  the group (unlike upstream, see ``dra.engine.selectors``): the device does not match, the failure
  diagnostics count it (``cel_error``, ``selector_errors``), and when some request's selectors match nothing
  but fail on some device the reason is ``selector_error_on_all_candidates``.

``simulate(snapshot, allocated, claims, node=None, features=None, *, allowed_clusters=None, budget=None)`` runs
one group against a throw-away engine: the function behind ``POST /api/v1/simulate`` and the conformance tests
(``dra.engine.simulate`` also turns the simulate body format into these inputs).

Determinism: pools are ordered by (driver, pool), slices by name, devices in slice order; clusters and nodes
by the bin-packing policy (``dra.engine.policy``) with names as the final tie-break. Equal input gives equal
output.
"""
from .engine import Engine
from .policy import POLICY_NAME
from .simulate import simulate
from .types import (
    AllocatedDevice,
    AllocationError,
    ClaimGroup,
    ClaimOutcome,
    ClusterInventory,
    ErrorCode,
    Features,
    FleetSnapshot,
    GroupOutcome,
    Reason,
    SearchBudget,
    allocated_from_dicts,
)

__all__ = [
    "Engine", "simulate", "POLICY_NAME", "AllocatedDevice", "AllocationError", "ClaimGroup", "ClaimOutcome",
    "ClusterInventory", "ErrorCode",
    "Features", "FleetSnapshot", "GroupOutcome", "Reason", "SearchBudget", "allocated_from_dicts",
]
