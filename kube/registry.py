"""What the /k8s door serves: each resource's group, versions, kind, scope and verbs (for discovery, the
OpenAPI documents and routing). The stores that read and write them are in ``kube.stores``."""
from __future__ import annotations

from dataclasses import dataclass

RESOURCE_GROUP = "resource.k8s.io"
OUR_GROUP = "draservice.io"
CLUSTER_LABEL = "draservice.io/cluster"  # on objects that belong to one cluster of the fleet
ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
READ_VERBS = ("get", "list")
CLAIM_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
# Versions whose manifests are still in articles but whose objects we cannot hold: creating one answers a 422
# with the manifest doctor's rewrite or skeleton (upstream removed v1alpha2 in 1.31), nothing else.
DOCTOR_ONLY_VERSIONS = ("v1alpha2",)
WRITE_VERBS = ("create", "delete", "get", "list", "patch", "update")
WORKLOAD_VERBS = ALL_VERBS  # watched by comparing renderings (kube.workload_watch): not in the change log


@dataclass(frozen=True)
class Resource:
    group: str
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    status: bool = False  # a /status subresource (written by the service only)
    categories: tuple[str, ...] = ()
    doctor_only: tuple[str, ...] = ()  # versions that only answer a create, with the manifest doctor's 422

    def verbs_in(self, version: str) -> tuple[str, ...]:
        if version in self.doctor_only:
            return ("create",)
        # What can be deleted one by one can be deleted by selector (kube.views: deletecollection).
        return self.verbs + ("deletecollection",) if "delete" in self.verbs else self.verbs

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def qualified(self) -> str:
        """``resourceclaims.resource.k8s.io``: how the API server names a resource in its messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version


RESOURCES: tuple[Resource, ...] = (
    Resource("", ("v1",), "namespaces", "Namespace", False, READ_VERBS, ("ns",)),
    Resource(RESOURCE_GROUP, CLAIM_VERSIONS + DOCTOR_ONLY_VERSIONS, "resourceclaims", "ResourceClaim", True,
             ALL_VERBS, status=True, doctor_only=DOCTOR_ONLY_VERSIONS),
    Resource(RESOURCE_GROUP, CLAIM_VERSIONS, "resourceclaimtemplates", "ResourceClaimTemplate", True, ALL_VERBS),
    Resource(RESOURCE_GROUP, CLAIM_VERSIONS, "deviceclasses", "DeviceClass", False, ALL_VERBS),
    Resource(RESOURCE_GROUP, CLAIM_VERSIONS, "resourceslices", "ResourceSlice", False, READ_VERBS),
    # Kubernetes 1.35 serves DeviceTaintRules at v1alpha3 only (k8s.io/api v0.35: resource/v1alpha3/register.go).
    Resource(RESOURCE_GROUP, ("v1alpha3",), "devicetaintrules", "DeviceTaintRule", False, ALL_VERBS),
    Resource(OUR_GROUP, ("v1alpha1",), "consumers", "Consumer", True, ("create", "delete", "get", "list", "watch")),
    Resource("", ("v1",), "events", "Event", True, READ_VERBS, ("ev",)),
    Resource(RESOURCE_GROUP, DOCTOR_ONLY_VERSIONS, "resourceclasses", "ResourceClass", False, ("create",),
             doctor_only=DOCTOR_ONLY_VERSIONS),
    Resource(OUR_GROUP, ("v1alpha1",), "gangs", "Gang", True, ("create", "delete", "get", "list")),
    Resource(OUR_GROUP, ("v1alpha1",), "queues", "Queue", False, WRITE_VERBS),
    Resource(OUR_GROUP, ("v1alpha1",), "reservations", "Reservation", False, WRITE_VERBS),
    Resource(RESOURCE_GROUP, ("v1alpha3",), "resourcepoolstatusrequests", "ResourcePoolStatusRequest", False,
             ("create", "delete", "get", "list")),
    # Workloads as users write them (kube.workload_stores): their pods become consumers, a PodGroup a gang.
    Resource("", ("v1",), "pods", "Pod", True, WORKLOAD_VERBS, ("po",), categories=("all",)),
    Resource("apps", ("v1",), "deployments", "Deployment", True, WORKLOAD_VERBS, ("deploy",), categories=("all",)),
    Resource("apps", ("v1",), "statefulsets", "StatefulSet", True, WORKLOAD_VERBS, ("sts",), categories=("all",)),
    Resource("batch", ("v1",), "jobs", "Job", True, WORKLOAD_VERBS, categories=("all",)),
    Resource("scheduling.x-k8s.io", ("v1alpha1",), "podgroups", "PodGroup", True, WORKLOAD_VERBS, ("pg", "pgs")),
    Resource("scheduling.k8s.io", ("v1alpha1",), "workloads", "Workload", True, WORKLOAD_VERBS),
    # What kubectl auth can-i asks (kube.authorization): answered, never stored.
    Resource("authorization.k8s.io", ("v1",), "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
             ("create",)),
    Resource("authorization.k8s.io", ("v1",), "selfsubjectrulesreviews", "SelfSubjectRulesReview", False,
             ("create",)),
)


def groups() -> dict[str, list[str]]:
    """group -> its versions, preferred first (the core group is "")."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        for v in r.versions:
            if v not in out.setdefault(r.group, []):
                out[r.group].append(v)
    return out


def in_version(group: str, version: str) -> list[Resource]:
    return [r for r in RESOURCES if r.group == group and version in r.versions]


def lookup(group: str, version: str, plural: str) -> Resource | None:
    for r in in_version(group, version):
        if r.plural == plural:
            return r
    return None


def by_plural(plural: str) -> Resource:
    return next(r for r in RESOURCES if r.plural == plural)
