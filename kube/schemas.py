"""One definition per kind the /k8s door serves, per version: the source of the OpenAPI v3 documents
(``kube.openapi``) and of ``fieldValidation`` (``kube.fields``).

resource.k8s.io fields, descriptions and list semantics follow k8s.io/api at 1.35 (``+listType`` markers:
``atomic`` unless declared otherwise, ``map`` keyed as declared); only fields the service validates are
declared, so what kubectl explains is what the service accepts. The sets of field names that the validators
check (``dra.k8s.slices``, ``dra.k8s.claims``, ``queues.spec``, ``gangs.spec``) are compared with these
definitions in tests/kube/test_schemas.py. Workload kinds (Pod, Deployment ...) keep their spec free-form:
the workloads app reads only a few of their fields and passes the rest through.
"""
from __future__ import annotations

from collections.abc import Callable

from kube.schema_nodes import (
    Node,
    array,
    boolean,
    free,
    integer,
    map_of,
    number,
    obj,
    obj_of,
    quantity,
    status,
    string,
    string_map,
    time,
)

ATOMIC = "atomic"

# --- metadata -----------------------------------------------------------------------------------------------

OBJECT_META = obj(
    "Standard object's metadata.",
    name=string("Name must be unique within a namespace (or the cluster, for cluster-scoped kinds)."),
    generateName=string("A prefix for a name the server generates when name is not given."),
    namespace=string("The namespace of a namespaced object; defaults to the one of the request."),
    uid=string("Unique in time and space; set by the server."),
    resourceVersion=string("The version of this object in the service's change log (opaque to clients)."),
    generation=integer("A sequence number representing a specific generation of the desired state."),
    creationTimestamp=time("When the object was created (set by the server)."),
    deletionTimestamp=time("When the object will be deleted (set by the server)."),
    deletionGracePeriodSeconds=integer("Seconds allowed for graceful termination."),
    finalizers=array(string(""), "Must be empty before the object is deleted from the registry.", "set"),
    labels=string_map("Map of string keys and values to organize and categorize objects (label selectors)."),
    annotations=string_map("Unstructured key value map stored with the object. draservice reads "
                           "draservice.io/allowed-clusters, draservice.io/lease-ttl, draservice.io/pending-timeout, "
                           "draservice.io/release."),
    ownerReferences=array(free("An object this one depends on."), "Objects this one depends on.", "map",
                          ("uid",)),
    managedFields=array(free("A field manager's set of fields."), "Which manager owns which fields."),
)


def _top(kind: str, api_version: str, doc: str, spec: Node | None, state: Node | None = None,
         **extra: Node) -> Node:
    props: dict[str, Node] = {
        "apiVersion": string("APIVersion defines the versioned schema of this representation of an object "
                             f"({api_version})."),
        "kind": string(f"Kind is a string value representing the REST resource this object represents ({kind})."),
        "metadata": OBJECT_META}
    if spec is not None:
        props["spec"] = spec
    if state is not None:
        props["status"] = status(state)
    props.update(extra)
    return obj_of(doc, props)


# --- resource.k8s.io: requests --------------------------------------------------------------------------------

SELECTOR = obj("A selector for devices.", cel=obj(
    "A CEL expression which must evaluate to true if a given device matches.",
    required=("expression",),
    expression=string("The expression (device.driver, device.attributes[...], device.capacity[...]); at most "
                      "10 Ki long.")))
TOLERATION = obj(
    "This claim tolerates any taint matching the key, value and effect.",
    key=string("The taint key; empty with operator Exists matches all keys."),
    operator=string("Exists or Equal (the default).", enum=("Equal", "Exists")),
    value=string("The taint value the toleration matches (operator Equal)."),
    effect=string("The taint effect to match; empty matches all.", enum=("NoExecute", "NoSchedule", "None")),
    tolerationSeconds=integer("How long a NoExecute taint is tolerated; unset: forever."))
CAPACITY_REQUIREMENTS = obj("The capacity each allocated device must provide (consumable capacity).",
                            requests=map_of(quantity(""), "Capacity name to the amount this request consumes."))


def _request_fields(admin: bool) -> dict[str, Node]:
    out = {
        "deviceClassName": string("The DeviceClass whose selectors and configuration apply to this request."),
        "selectors": array(SELECTOR, "Selectors every device must satisfy (all of them).", ATOMIC),
        "allocationMode": string("ExactCount (the default, with count) or All (every matching device).",
                                 enum=("All", "ExactCount")),
        "count": integer("The number of devices with allocationMode ExactCount (default 1)."),
        "tolerations": array(TOLERATION, "Taints of devices that this request tolerates.", ATOMIC),
        "capacity": CAPACITY_REQUIREMENTS}
    if admin:
        out["adminAccess"] = boolean("Access to devices already in use, for monitoring (admin namespaces only).")
    return out


SUBREQUEST = obj("One alternative of firstAvailable.", required=("name", "deviceClassName"),
                 name=string("Referenced as <request>/<subrequest>; a DNS label."), **_request_fields(False))
FIRST_AVAILABLE = array(SUBREQUEST, "Alternatives, the first that can be satisfied is allocated.", ATOMIC)
EXACTLY = obj("A request for devices that must all match it.", required=("deviceClassName",),
              **_request_fields(True))
REQUEST_V1 = obj("A request for devices: exactly one of exactly or firstAvailable.", required=("name",),
                 name=string("Names the request in constraints and config; a DNS label."),
                 exactly=EXACTLY, firstAvailable=FIRST_AVAILABLE)
REQUEST_FLAT = obj("A request for devices (this version keeps the request's fields on it).", required=("name",),
                   name=string("Names the request in constraints and config; a DNS label."),
                   **_request_fields(True), firstAvailable=FIRST_AVAILABLE)
CONSTRAINT = obj(
    "A constraint across the devices of the listed requests.",
    requests=array(string(""), "The requests it applies to; all requests when empty.", ATOMIC),
    matchAttribute=string("All devices must have this attribute with the same value."),
    distinctAttribute=string("All devices must have this attribute with different values."))
OPAQUE = obj("Driver parameters, passed through.", required=("driver",),
             driver=string("The driver the parameters are for."),
             parameters=free("Any JSON the driver understands (at most 10 Ki)."))
CLAIM_CONFIG = obj("Configuration for the devices of some requests.",
                   requests=array(string(""), "The requests it applies to; all when empty.", ATOMIC),
                   opaque=OPAQUE)


def claim_spec(request: Node) -> Node:
    return obj("What is requested and how to configure it; immutable.", devices=obj(
        "Requests, constraints and configuration of the claim's devices.",
        requests=array(request, "The requests; at most 32.", ATOMIC),
        constraints=array(CONSTRAINT, "Constraints across requests.", ATOMIC),
        config=array(CLAIM_CONFIG, "Configuration for requested devices.", ATOMIC)))


ALLOCATION = obj(
    "Where and which devices were allocated (set by the service).",
    devices=obj("The allocated devices.",
                results=array(free("One allocated device: request, driver, pool, device."), "Devices.", ATOMIC),
                config=array(free("Configuration of allocated devices."), "Configuration.", ATOMIC)),
    nodeSelector=free("The nodes where the allocated devices can be used."),
    allocationTimestamp=time("When the claim was allocated."))
CLAIM_STATUS = obj(
    "Whether the claim is allocated, and where it stands in its queue (draservice's additions).",
    allocation=ALLOCATION,
    reservedFor=array(free("A consumer of the claim."), "Consumers using the claim.", "map", ("uid",)),
    devices=array(free("The status of an allocated device."), "Devices' status.", "map",
                  ("driver", "device", "pool", "shareID")),
    phase=string("Pending, Allocated, Released, Failed or Unschedulable (draservice)."),
    reason=string("Why the claim is in its phase (machine-readable)."),
    message=string("Why the claim is in its phase."),
    cluster=string("The fleet cluster the claim is allocated in (draservice)."),
    node=string("The node of a node-local allocation (draservice)."),
    conditions=array(free("A condition."), "Conditions of the claim.", "map", ("type",)),
    attempts=integer("Allocation rounds that tried the claim."),
    lastAttemptTime=time("The last allocation round that tried it."),
    allocatedTime=time("When it was allocated."),
    releasedTime=time("When it was released."),
    lease=obj("The claim's lease, its walltime (draservice.io/lease-ttl): it runs from allocation.",
              leaseDurationSeconds=integer("The lease's length."),
              expireTime=time("When the lease ends: null until the claim is allocated."),
              renewTime=time("When it was last renewed.")),
    queue=string("The draservice Queue the claim is admitted through."),
    positionInQueue=integer("1-based place among the queue's pending claims."),
    estimatedStartTime=time("When the claim is expected to be allocated (a forecast from leases and history)."),
    estimate=obj("Why estimatedStartTime is what it is, or absent.", reason=string("Machine-readable."),
                 message=string("Human-readable.")),
    preemption=obj("The claim's last preemption notice: it keeps its devices until it has stopped (confirmedAt) "
                   "or until forceAt, whichever is first.",
                   stopBy=time("When its holder is to have stopped using the devices (notice + graceSeconds)."),
                   forceAt=time("When the devices go at the latest (notice + forceAfterSeconds)."),
                   confirmedAt=time("When it was confirmed that the claim stopped (absent: not, or forced)."),
                   confirmedBy=string("Who confirmed it: agent:<cluster>, admin:<name>, namespace:<name>, "
                                      "NoConsumer.")))


def resource_claim(version: str) -> Node:
    request = REQUEST_V1 if version in ("v1", "v1beta2") else REQUEST_FLAT
    return _top("ResourceClaim", f"resource.k8s.io/{version}",
                "ResourceClaim describes a request for access to devices in the fleet; draservice allocates it.",
                claim_spec(request), CLAIM_STATUS)


def resource_claim_template(version: str) -> Node:
    request = REQUEST_V1 if version in ("v1", "v1beta2") else REQUEST_FLAT
    return _top("ResourceClaimTemplate", f"resource.k8s.io/{version}",
                "A template for the claims a consumer's entry creates.",
                obj("The template.", required=("spec",), metadata=OBJECT_META, spec=claim_spec(request)))


# --- resource.k8s.io: inventory -------------------------------------------------------------------------------

CLASS_CONFIG = obj("Configuration for the devices of the class.", opaque=OPAQUE)


def device_class(version: str) -> Node:
    return _top("DeviceClass", f"resource.k8s.io/{version}",
                "Selectors and configuration that claims reference by name (fleet-wide or a cluster's).",
                obj("The class.",
                    selectors=array(SELECTOR, "Every device of the class satisfies all of these.", ATOMIC),
                    config=array(CLASS_CONFIG, "Configuration for every device of the class.", ATOMIC),
                    extendedResourceName=string("The extended resource name devices of this class serve.")))


TAINT = obj("A taint: claims that do not tolerate it do not get the device.", required=("key", "effect"),
            key=string("The taint key; a label name."), value=string("The taint value; a label value."),
            effect=string("None, NoSchedule or NoExecute.", enum=("NoExecute", "NoSchedule", "None")),
            timeAdded=time("When the taint was added."))
ATTRIBUTE = obj("One typed value.", int=integer("An integer."), bool=boolean("A boolean."),
                string=string("A string (at most 64)."), version=string("A semantic version."),
                ints=array(integer(""), "Integers.", ATOMIC), bools=array(boolean(""), "Booleans.", ATOMIC),
                strings=array(string(""), "Strings.", ATOMIC), versions=array(string(""), "Versions.", ATOMIC))
DEVICE_CAPACITY = obj("A capacity of a device.", value=quantity("The total."),
                      requestPolicy=free("How claims consume it (default, validValues, validRange)."))
DEVICE_FIELDS: dict[str, Node] = {
    "attributes": map_of(ATTRIBUTE, "The device's attributes, by qualified name."),
    "capacity": map_of(DEVICE_CAPACITY, "The device's capacities, by qualified name."),
    "consumesCounters": array(free("Counters of a counter set it consumes."), "Shared counters it uses.", ATOMIC),
    "nodeName": string("The node the device is reachable from."),
    "nodeSelector": free("The nodes the device is reachable from."),
    "allNodes": boolean("Reachable from every node."),
    "taints": array(TAINT, "The device's taints.", ATOMIC),
    "bindsToNode": boolean("Its allocation binds the claim to a node."),
    "bindingConditions": array(string(""), "Conditions before binding.", ATOMIC),
    "bindingFailureConditions": array(string(""), "Conditions that fail binding.", ATOMIC),
    "allowMultipleAllocations": boolean("Several claims may share the device (consumable capacity)."),
    "nodeAllocatableResources": free("Node allocatable resources the device stands for.")}


def resource_slice(version: str) -> Node:
    if version in ("v1", "v1beta2"):
        device = obj("A device.", required=("name",), name=string("The device's name in its pool; a DNS label."),
                     **DEVICE_FIELDS)
    else:
        device = obj("A device.", required=("name",), name=string("The device's name in its pool; a DNS label."),
                     basic=obj_of("The device's fields (this version nests them).", DEVICE_FIELDS))
    spec = obj("The devices of one pool (or part of it) that a driver publishes.", required=("driver", "pool"),
               driver=string("The driver's name."),
               pool=obj("The pool.", required=("name", "generation", "resourceSliceCount"),
                        name=string("The pool's name."), generation=integer("The pool's generation."),
                        resourceSliceCount=integer("The number of slices of the pool's generation.")),
               nodeName=string("The node of node-local devices."), nodeSelector=free("The devices' nodes."),
               allNodes=boolean("Reachable from all nodes."),
               perDeviceNodeSelection=boolean("Each device says where it is reachable."),
               devices=array(device, "The devices.", ATOMIC),
               sharedCounters=array(free("A counter set."), "Counter sets devices consume.", ATOMIC),
               partitionTypeAttribute=string("The attribute naming a device's partition type."),
               skipNodeOperations=boolean("Drivers need no node-side preparation."))
    return _top("ResourceSlice", f"resource.k8s.io/{version}",
                "Devices a cluster's driver publishes (read-only at the door: agents report them).", spec)


def pool_status_request(version: str) -> Node:
    return _top("ResourcePoolStatusRequest", f"resource.k8s.io/{version}",
                "A one-time question: how many devices of a driver's pools are allocated, and how many left.",
                obj("What to count.", required=("driver",), driver=string("The driver."),
                    poolName=string("Only this pool."), limit=integer("At most this many pools.")),
                free("The answer, per pool."))


# --- draservice.io ------------------------------------------------------------------------------------------

LIMITS = obj("Limits of one unit.", required=("nominal",),
             nominal=quantity("What the queue is guaranteed."),
             borrowingLimit=quantity("How much more it may borrow from its cohort."),
             lendingLimit=quantity("How much of nominal others may borrow."))
QUOTA = obj("A quota of one DeviceClass.", required=("deviceClassName",),
            deviceClassName=string("The DeviceClass it covers."),
            clusterSelector=obj("Only in clusters with these labels.", matchLabels=string_map("Labels.")),
            devices=LIMITS, counters=map_of(LIMITS, "By counter name."),
            capacity=map_of(LIMITS, "By capacity name."))
PREEMPTION = obj("When the queue's pending claims preempt running ones.",
                 withinQueue=string("Own queue's claims it may preempt: Never, LowerPriority (default) or "
                                    "LowerOrNewerEqualPriority.",
                                    enum=("Never", "LowerPriority", "LowerOrNewerEqualPriority")),
                 reclaimWithinCohort=string("Within its nominal, claims of borrowing queues it may preempt: Never, "
                                            "LowerPriority or Any (default). Replaces reclaimBorrowed "
                                            "(Always: Any), still accepted on input.",
                                            enum=("Never", "LowerPriority", "Any")),
                 reclaimBorrowed=string("Deprecated, replaced by reclaimWithinCohort (Always: Any, Never: Never); "
                                        "accepted on input, never returned.", enum=("Never", "Always")),
                 borrowWithinCohort=obj("When it must borrow: whether it may preempt lower-priority claims of "
                                        "borrowing queues (not with fairSharing.preemptionStrategies).",
                                        policy=string("Never (default) or LowerPriority.",
                                                      enum=("Never", "LowerPriority")),
                                        maxPriorityThreshold=integer("Only claims of at most this priority.")),
                 minRuntimeSeconds=integer("A claim runs at least this long before it can be preempted."),
                 graceSeconds=integer("Time between the preemption notice and its stopBy."),
                 forceAfterSeconds=integer("Time between the preemption notice and the release of a victim that "
                                           "did not confirm it stopped (at least graceSeconds; default graceSeconds)."),
                 webhook=obj("Told before a claim is preempted.", url=string("HTTPS URL."),
                             secret=string("HMAC secret (write-only; generated when absent)."),
                             secretSet=boolean("Whether a secret is set (read-only).")))
FAIR_SHARING = obj("How the queue's past use counts in the fair-share order, and fair-share preemption.",
                   halfLifeSeconds=integer("Half-life of past use in seconds (0, the default: only what it borrows "
                                           "now counts; at most 31536000)."),
                   weight=number("spec.weight, in Kueue's place (either may be given; both, equal)."),
                   preemptionStrategies=array(string("LessThanOrEqualToFinalShare or LessThanInitialShare."),
                                              "Fair-share preemption when a claim must borrow, strategies tried "
                                              "in order (absent: off).", ATOMIC))
QUEUE_STATUS = obj("Usage and backlog of the queue.",
                   usage=array(free("Used amount of one class and unit."), "What the queue uses.", ATOMIC),
                   pendingClaims=integer("Claims pending in the queue."),
                   fairSharing=obj("The queue's place in the fair-share order.",
                                   decayedUsage=number("Device-hours used, decayed by the half-life (0 without)."),
                                   rank=integer("1 = served first among the queues.")))


def queue(version: str) -> Node:
    spec = obj("Quotas, fair-share weight, priorities and preemption of the namespaces it serves.",
               parent=string("The parent queue (a cohort: unused quota is lent among siblings)."),
               namespaces=array(string(""), "The namespaces whose claims go through this queue.", "set"),
               quotas=array(QUOTA, "Quotas by DeviceClass (at most 64).", ATOMIC),
               weight=number("Its share of the fleet against its siblings (default 1)."),
               priority=integer("Higher goes first among equal shares."),
               maxPriority=integer("The highest priority its claims may ask for."),
               preemption=PREEMPTION, fairSharing=FAIR_SHARING,
               planDepth=integer("How many of its first pending claims the plan gives a start (default 10, at "
                                 "most 100; 0: none)."))
    return _top("Queue", f"draservice.io/{version}", "A fleet-wide queue of claims (admins write them).", spec,
                QUEUE_STATUS)


LABELS_SELECTOR = obj("Labels that must all match.", matchLabels=string_map("Labels."))
WINDOW = obj("When the capacity is booked, in wall-clock time of timeZone.", required=("start", "end"),
             start=string("Start, e.g. 2026-12-01T02:00:00 (no offset: wall-clock time in timeZone)."),
             end=string("End, after start (a recurring window lasts at most its period)."),
             timeZone=string("An IANA time zone, e.g. Europe/Berlin (default UTC)."),
             recurrence=obj("Repeat the window.", required=("frequency",),
                            frequency=string("Daily or Weekly.", enum=("Daily", "Weekly")),
                            daysOfWeek=array(string("", enum=("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")),
                                             "Weekdays it runs on (Weekly: default the start's).", "set"),
                            until=string("The last date it runs on (inclusive), e.g. 2027-03-01.")))
RESERVED = obj("Capacity of one DeviceClass.", required=("deviceClassName",),
               deviceClassName=string("The DeviceClass."), devices=integer("How many devices."),
               counters=map_of(quantity("An amount."), "By counter name (booked, not held)."),
               capacity=map_of(quantity("An amount."), "By capacity name (booked, not held)."),
               clusterSelector=LABELS_SELECTOR, nodeSelector=LABELS_SELECTOR,
               topologyKey=string("A node label: all devices on nodes with one value of it."))
RESERVATION_STATUS = obj("Whether the booking holds, what is held now, the next window and its use.",
                         conditions=array(free("Ready, Degraded."), "Conditions.", "map", ("type",)),
                         held=free("Devices booked; while held, the occurrence and its nodes."),
                         nextWindow=obj("The occurrence running now, or the next.", start=time("Start."),
                                        end=time("End.")),
                         utilisation=free("Devices its claims hold now, of those reserved."))


def reservation(version: str) -> Node:
    spec = obj("A window of capacity for some namespaces and queues.", required=("window", "resources", "users"),
               window=WINDOW, resources=array(RESERVED, "What is booked (at most 16).", ATOMIC),
               users=obj("Who may run in it (label draservice.io/reservation: <name>).",
                         namespaces=array(string(""), "Namespaces.", "set"),
                         queues=array(string(""), "Queues.", "set")),
               leadTimeSeconds=integer("From start minus this, nothing new that would still run at start lands on "
                                       "the held capacity."),
               reclaimBorrowed=boolean("At start minus the lead time, borrowed capacity on it is reclaimed with "
                                       "notice."),
               lendIdle=boolean("Inside the window, idle held capacity takes claims that end before the end."))
    return _top("Reservation", f"draservice.io/{version}",
                "Fleet capacity booked for a future window, once or recurring (admins write them).", spec,
                RESERVATION_STATUS)


def consumer(version: str) -> Node:
    entry = obj("A claim the consumer uses.", required=("name",), name=string("The entry's name."),
                resourceClaimName=string("An existing claim in the namespace."),
                resourceClaimTemplateName=string("A template: the service creates one claim for the entry."))
    spec = obj("The claims a workload uses together.",
               resourceClaims=array(entry, "Its claims.", "map", ("name",)))
    return _top("Consumer", f"draservice.io/{version}",
                "A pod-like user of claims: its reservations keep them allocated.", spec,
                free("Phase, per-claim status and queue place."))


def gang(version: str) -> Node:
    spec = obj("All-or-nothing placement of its members.",
               minMember=integer("Members that must be placed together (default: all)."),
               scheduleTimeoutSeconds=integer("Give up after this long pending."),
               topology=free("The topology domain levels to pack members in."),
               placement=free("Placement preferences."), members=array(free("A member: a consumer spec."),
                                                                        "The members.", ATOMIC),
               replicas=integer("Members made from template."), template=free("A member template."))
    return _top("Gang", f"draservice.io/{version}", "Members placed all together or not at all.", spec,
                free("Phase, placement and members' state."))


# --- served as the workloads app and the core group see them --------------------------------------------------

def _loose(kind: str, api_version: str, doc: str, spec: bool = True) -> Node:
    return _top(kind, api_version, doc, free("Passed through (the service reads only a few fields).")
                if spec else None, free("Set by the service."))


def device_taint_rule(version: str) -> Node:
    selector = obj("Which devices the taint applies to (all criteria must match).",
                   driver=string("Only devices of this driver."), pool=string("Only devices of this pool."),
                   device=string("Only devices of this name."),
                   # Tombstoned in 1.35; declared so that a manifest still naming them is refused with the
                   # reason (dropping them as unknown would widen the selector to more devices).
                   deviceClassName=string("Removed in Kubernetes 1.35: refused; select by driver, pool, device."),
                   selectors=array(SELECTOR, "Removed in Kubernetes 1.35: refused.", ATOMIC))
    spec = obj("The selector and one taint.", required=("taint",), deviceSelector=selector, taint=TAINT)
    return _top("DeviceTaintRule", f"resource.k8s.io/{version}",
                "Taints the selected devices without changing their ResourceSlices.", spec,
                obj("Provides information about what was requested in the spec.",
                    conditions=array(free("A condition."), "At most 8.", "map", ("type",))))


DEFINITIONS: dict[str, Callable[[str], Node]] = {
    "ResourceClaim": resource_claim, "ResourceClaimTemplate": resource_claim_template,
    "DeviceClass": device_class, "ResourceSlice": resource_slice,
    "ResourcePoolStatusRequest": pool_status_request, "DeviceTaintRule": device_taint_rule,
    "Queue": queue, "Reservation": reservation, "Consumer": consumer, "Gang": gang,
    "Namespace": lambda v: _loose("Namespace", v, "A namespace: a tenant's claims and consumers.", spec=False),
    "Event": lambda v: _top("Event", v, "What happened to an object (from claims' events).", None,
                            **{k: free(k) for k in ("involvedObject", "source")},
                            **{k: string(k) for k in ("reason", "message", "type", "firstTimestamp",
                                                      "lastTimestamp")}, count=integer("Occurrences.")),
    "ResourceClass": lambda v: _loose("ResourceClass", f"resource.k8s.io/{v}",
                                      "Removed in Kubernetes 1.31: a create answers the manifest doctor's rewrite."),
}


# Kinds whose bodies are checked against their definition (``fieldValidation``); the others are read-only,
# doctor-only or workloads passed through.
VALIDATED = frozenset({"ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "ResourcePoolStatusRequest",
                       "DeviceTaintRule", "Queue", "Reservation", "Consumer", "Gang"})


def definition(kind: str, group: str, version: str) -> Node:
    """The kind's definition at this version; workload kinds are free-form below metadata."""
    make = DEFINITIONS.get(kind)
    if make is not None:
        return make(version)
    api_version = f"{group}/{version}" if group else version
    return _loose(kind, api_version, f"{kind} ({api_version}): its pods become consumers (workloads).")
