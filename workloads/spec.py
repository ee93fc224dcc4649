"""Reading workloads as users write them: the pod template, the replica count, the pods' names, their claim
entries, extended resources and queue labels. Pure: no database (the services look DeviceClasses up).

Pods are named as upstream's controllers name them, so that ``kubectl get pods`` and the claims made for them
(``<pod>-<entry>-<random>``, the resourceclaim controller's naming) look as they would in a cluster:
Deployment ``<deployment>-<pod-template-hash>-<random>``, StatefulSet ``<sts>-<ordinal>``, Job
``<job>-<random>`` (Indexed: ``<job>-<index>-<random>``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from claims import k8s
from draservice.errors import Invalid
from queues.services.resolve import PRIORITY_LABEL, QUEUE_LABELS
from workloads.models import Kind

POD_GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")
EXTENDED_ENTRY = "extended-resources"  # upstream names the generated claim <pod>-extended-resources-<random>
# KAI Scheduler's default priority classes: a pod's priorityClassName becomes its claims' priority in their
# queue (``draservice.io/priority``). There is no PriorityClass object here; other names are refused, as the
# API server's Priority admission refuses a class that does not exist.
PRIORITY_CLASSES = {"train": 50, "interactive-preemptible": 75, "build": 100, "inference": 125}
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand.SafeEncodeString
_NATIVE = {"cpu", "memory", "ephemeral-storage", "pods", "storage"}
MAX_REPLICAS = 512
DEVICECLASS_DOMAIN = "deviceclass.resource.kubernetes.io"


@dataclass
class PodTemplate:
    labels: dict
    annotations: dict
    spec: dict
    entries: list[dict] = field(default_factory=list)  # spec.resourceClaims
    extended: list[tuple[str, str, int]] = field(default_factory=list)  # (request name, resource, count)

    @property
    def group(self) -> str:
        """The pod's group: a PodGroup by label, or a Workload's pod group by ``spec.workloadRef``."""
        name = next((self.labels[k] for k in POD_GROUP_LABELS if self.labels.get(k)), None)
        if name:
            return f"{Kind.PODGROUP}/{name}"
        ref = _dict(self.spec.get("workloadRef"))
        if ref.get("name") and ref.get("podGroup"):
            key = ref.get("podGroupReplicaKey")
            return f"{Kind.WORKLOAD}/{ref['name']}/{ref['podGroup']}" + (f"/{key}" if key else "")
        return ""

    @property
    def wanted_claims(self) -> int:
        return len(self.entries) + (1 if self.extended else 0)


def template_of(kind: str, spec: dict, meta: dict, path: str = "spec") -> PodTemplate:
    """The pod template of a workload (a Pod's own spec and metadata); raises Invalid."""
    if kind == Kind.POD:
        tmeta, pspec, ppath = meta, spec, path
    else:
        tpl = spec.get("template")
        if not isinstance(tpl, dict) or not isinstance(tpl.get("spec"), dict):
            raise Invalid([(f"{path}.template.spec", "Required value")])
        tmeta = _dict(tpl.get("metadata"))
        meta_errors = k8s.check_string_map(tmeta.get("labels"), f"{path}.template.metadata.labels", labels=True) \
            + k8s.check_string_map(tmeta.get("annotations"), f"{path}.template.metadata.annotations", labels=False)
        if meta_errors:
            raise Invalid(meta_errors)
        pspec, ppath = tpl["spec"], f"{path}.template.spec"
    errors: list[tuple[str, str]] = []
    containers = pspec.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        errors.append((f"{ppath}.containers", "Required value: a non-empty list of containers"))
        containers = []
    entries = pspec.get("resourceClaims") or []
    if not isinstance(entries, list):
        errors.append((f"{ppath}.resourceClaims", "must be a list"))
        entries = []
    extended = _extended(containers, ppath, errors)
    priority = pspec.get("priorityClassName")
    if priority and priority not in PRIORITY_CLASSES:
        errors.append((f"{ppath}.priorityClassName", f'Invalid value: "{priority}": no PriorityClass with name '
                                                     f'{priority} was found (known: {", ".join(PRIORITY_CLASSES)})'))
    if errors:
        raise Invalid(errors)
    return PodTemplate(dict(_dict(tmeta.get("labels"))), dict(_dict(tmeta.get("annotations"))), pspec,
                       list(entries), extended)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def split_group(group: str) -> tuple[str, str, str, str]:
    """(kind, object name, pod group, replica key) of a pod's group."""
    kind, _, rest = group.partition("/")
    name, _, rest = rest.partition("/")
    pod_group, _, replica = rest.partition("/")
    return kind, name, pod_group, replica


def gang_name(group: str) -> str:
    """The gang a group becomes: the PodGroup's name; <workload>-<pod group>[-<replica key>]."""
    kind, name, pod_group, replica = split_group(group)
    return name if kind == Kind.PODGROUP else "-".join(p for p in (name, pod_group, replica) if p)


def _is_extended(resource: str) -> bool:
    """Upstream's IsExtendedResourceName: a domain-prefixed name outside kubernetes.io (not cpu, memory...)."""
    domain, slash, _ = resource.partition("/")
    if domain == DEVICECLASS_DOMAIN:  # upstream's implicit name of every class: <domain>/<class name>
        return True
    return bool(slash) and not domain.endswith("kubernetes.io") and resource not in _NATIVE and \
        not resource.startswith("requests.")


def _extended(containers: list[dict], path: str, errors: list) -> list[tuple[str, str, int]]:
    """Each container's extended resources as requests named as upstream names them: container-<i>-request-<j>."""
    out = []
    for i, container in enumerate(containers):
        resources = _dict(container.get("resources"))
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        j = 0
        for resource in sorted(amounts):
            if not _is_extended(resource):
                continue
            raw = amounts[resource]
            try:
                count = int(str(raw))
            except ValueError:
                count = 0
            if count < 1:
                errors.append((f"{path}.containers[{i}].resources.limits[{resource}]",
                               f"Invalid value: {raw!r}: an extended resource must be a positive whole number"))
                continue
            out.append((f"container-{i}-request-{j}", resource, count))
            j += 1
    return out


def extended_claim_spec(extended: list[tuple[str, str, int]], classes: dict[str, str]) -> dict:
    """The claim made for a pod's extended resources: one request per container resource, in the class that
    serves it (``DeviceClass.spec.extendedResourceName``)."""
    return {"devices": {"requests": [{"name": name, "exactly": {"deviceClassName": classes[resource],
                                                                "allocationMode": "ExactCount", "count": count}}
                                     for name, resource, count in extended]}}


def claim_labels(workload_labels: dict, template: PodTemplate) -> dict:
    """What a pod's generated claims carry so they go to the pod's queue: the queue and priority labels of
    the workload (Kueue puts ``kueue.x-k8s.io/queue-name`` on the Job), then of the pod, then the priority
    of ``priorityClassName`` unless a priority label says otherwise."""
    keys = (*QUEUE_LABELS, PRIORITY_LABEL)
    out = {k: str(v) for source in (workload_labels, template.labels) for k, v in (source or {}).items() if k in keys}
    priority = template.spec.get("priorityClassName")
    if priority in PRIORITY_CLASSES and PRIORITY_LABEL not in out:
        out[PRIORITY_LABEL] = str(PRIORITY_CLASSES[priority])
    return out


# ------------------------------------------------------------------------------------------- replicas

def desired_pods(kind: str, spec: dict) -> int:
    """How many pods the workload wants now. A Job wants min(parallelism, completions) pods and none while
    suspended (Kueue creates Jobs suspended and unsuspends them when admitted); nothing ever completes here."""
    if kind == Kind.POD:
        return 1
    if kind == Kind.JOB:
        if spec.get("suspend"):
            return 0
        parallelism = _count_or(spec.get("parallelism"), 1)
        completions = spec.get("completions")
        return min(parallelism, completions) if isinstance(completions, int) else parallelism
    return _count_or(spec.get("replicas"), 1)


def _count_or(value: Any, default: int) -> int:
    """A count as written (``check_counts`` has refused bad ones); null means the default, as upstream."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def check_counts(kind: str, spec: dict) -> None:
    keys = {Kind.DEPLOYMENT: ("replicas",), Kind.STATEFULSET: ("replicas",),
            Kind.JOB: ("parallelism", "completions")}.get(Kind(kind), ())
    errors = []
    for key in keys:
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value <= MAX_REPLICAS):
            errors.append((f"spec.{key}", f"Invalid value: {value!r}: must be between 0 and {MAX_REPLICAS}"))
    if errors:
        raise Invalid(errors)


def check_selector(kind: str, spec: dict, template: PodTemplate) -> None:
    """apps/v1 requires a selector that matches the template's labels (matchLabels; expressions are taken
    as written)."""
    if kind not in (Kind.DEPLOYMENT, Kind.STATEFULSET):
        return
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        raise Invalid([("spec.selector", "Required value")])
    wanted = selector.get("matchLabels") or {}
    if any(template.labels.get(k) != v for k, v in wanted.items()):
        raise Invalid([("spec.template.metadata.labels", "Invalid value: selector does not match template "
                                                             "labels")])


def template_hash(template: Any) -> str:
    """pod-template-hash: FNV-1a (32 bit) of the template, its decimal digits safe-encoded (as
    ``controller.ComputeHash`` then ``rand.SafeEncodeString``)."""
    h = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True, separators=(",", ":")).encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(c) % len(_SAFE)] for c in str(h))


def pod_name(kind: str, owner: str, index: int, thash: str) -> str:
    if kind == Kind.STATEFULSET:
        return f"{owner}-{index}"
    if kind == Kind.DEPLOYMENT:
        return f"{owner}-{thash}-{k8s.random_suffix()}"
    return f"{owner}-{k8s.random_suffix()}"


def indexed_job_name(owner: str, index: int) -> str:
    return f"{owner}-{index}-{k8s.random_suffix()}"
