"""Pod groups: pods that start together or not at all.

Two ways to write them: a ``scheduling.x-k8s.io/v1alpha1`` PodGroup (the coscheduling plugin's: ``minMember``,
pods labelled ``scheduling.x-k8s.io/pod-group: <name>``), or a pod group of an upstream
``scheduling.k8s.io/v1alpha1`` Workload (``spec.podGroups[]`` with ``policy.gang.minCount`` or
``policy.basic``, pods with ``spec.workloadRef: {name, podGroup, podGroupReplicaKey}``; each replica key is a
group of its own).

The pods of a group wait (``Gate.POD_GROUP``, no consumer) until the group is defined and has its minimum of
them; then all of them become ONE Gang of the gangs app (``create_gang``: member = pod, its consumer made by the
claims app, its claims still named after the pod and labelled with its queue), placed all or nothing by the
gang worker. A gang's members are fixed: pods that come later wait with ``Gate.FORMED``. A ``basic`` group's
pods get their consumers one by one. Deleting the group deletes its gangs (their claims released); its pods
wait again.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from claims.models import Namespace
from claims.services import consumers as consumer_services
from dra.gang import Topology
from draservice.errors import Invalid, ServiceError
from gangs.models import Gang, GangMember
from gangs.services import gangs as gang_services
from workloads import spec as wspec
from workloads import workloads_sql
from workloads.models import Gate, Kind, Workload
from workloads.services import pods as pod_services

MAX_TIMEOUT = 7 * 24 * 3600
_MEMBER = re.compile(r"^spec\.members\[(\d+)\]\.(.*)$")
KAI_TOPOLOGY = "kai.scheduler/topology"
GROUP_LABEL = "workloads.draservice.io/group-of"  # on a group's gangs: <kind>.<name> of what defines them


def _count(spec: dict, key: str, path: str, errors: list, default=None, top: int = wspec.MAX_REPLICAS):
    value = spec.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top):
        errors.append((f"{path}.{key}", f"Invalid value: {value!r}: must be between 1 and {top}"))
    return value


def parse(kind: str, spec: dict) -> dict:
    """A PodGroup's minMember (default 1) and scheduleTimeoutSeconds (minResources is ignored: the gang places
    the pods' own claims); a Workload's podGroups, each with exactly one of policy.basic or policy.gang."""
    errors: list[tuple[str, str]] = []
    if kind == Kind.PODGROUP:
        _count(spec, "minMember", "spec", errors, 1)
        _count(spec, "scheduleTimeoutSeconds", "spec", errors, None, MAX_TIMEOUT)
    else:
        groups = spec.get("podGroups")
        if not isinstance(groups, list) or not groups:
            errors.append(("spec.podGroups", "Required value: a non-empty list"))
            groups = []
        names = set()
        for i, group in enumerate(groups):
            path = f"spec.podGroups[{i}]"
            group = group if isinstance(group, dict) else {}
            if not group.get("name") or group["name"] in names:
                errors.append((f"{path}.name", "Required value: a unique name"))
            names.add(group.get("name"))
            policy: dict = group["policy"] if isinstance(group.get("policy"), dict) else {}
            if ("basic" in policy) == ("gang" in policy):
                errors.append((f"{path}.policy", "Invalid value: exactly one of basic or gang"))
            elif "gang" in policy:
                _count(policy["gang"] if isinstance(policy["gang"], dict) else {}, "minCount",
                       f"{path}.policy.gang", errors, 1)
    if errors:
        raise Invalid(errors)
    return spec


@dataclass
class Definition:
    row: Workload  # the PodGroup or Workload, locked
    gang: str  # the gang's name
    min_member: int | None  # None: a basic policy (no gang)
    timeout: int | None = None


def _lock_group(ns: Namespace, kind: str, name: str) -> None:
    """Serialize, per PodGroup or Workload name, the transactions that add a pod to it or define it, until
    commit. Each takes this after its own insert and before it looks for the other side, so whichever comes
    second sees the first's rows: a group defined while its last pod arrives is formed by one of them, not
    missed by both. (SQLite, the embedded default, serializes every write transaction already.)"""
    digest = hashlib.blake2b(f"workloads-group\x1f{ns.pk}\x1f{kind}\x1f{name}".encode(), digest_size=8).digest()
    workloads_sql.lock_until_commit(int.from_bytes(digest, "big", signed=True))


def _definition(ns: Namespace, group: str) -> Definition | None:
    kind, name, pod_group, _ = wspec.split_group(group)
    _lock_group(ns, kind, name)
    row = (Workload.objects.select_for_update(of=("self",)).select_related("namespace")
           .filter(namespace=ns, kind=kind, name=name).first())
    if row is None:
        return None
    if kind == Kind.PODGROUP:
        return Definition(row, wspec.gang_name(group), row.spec.get("minMember", 1),
                          row.spec.get("scheduleTimeoutSeconds"))
    entry = next((g for g in row.spec.get("podGroups") or [] if g.get("name") == pod_group), None)
    if entry is None:
        return None
    gang = (entry.get("policy") or {}).get("gang")
    return Definition(row, wspec.gang_name(group), gang.get("minCount", 1) if gang is not None else None)


def is_formed(ns: Namespace, group: str) -> bool:
    return Gang.objects.filter(namespace=ns, name=wspec.gang_name(group),
                               labels__has_key=GROUP_LABEL).exists()


def form(ns: Namespace, group: str) -> bool:
    """Make the group a gang if it is defined, is not one yet and has its minimum of waiting pods (a basic
    group: start its pods). The caller's transaction; the group's row is locked first (two pods arriving at
    once form it once)."""
    definition = _definition(ns, group)
    if definition is None or is_formed(ns, group):
        return False
    waiting = list(Workload.objects.select_for_update(of=("self",)).select_related("owner", "namespace")
                   .filter(namespace=ns, group=group, kind=Kind.POD, gate=Gate.POD_GROUP).order_by("name"))
    if definition.min_member is None:
        for pod in waiting:
            pod_services.start(pod, pod_services.template_of_pod(pod), pod.owner.labels if pod.owner else {},
                               f"pods[{pod.name}].spec")
        return bool(waiting)
    if len(waiting) < definition.min_member:
        return False
    members, generated = [], {}
    for pod in waiting:
        template = pod_services.template_of_pod(pod)
        members.append({"name": pod.name, "resourceClaims": template.entries})
        generated[pod.name] = pod_services.generated_for(pod, template, pod.owner.labels if pod.owner else {},
                                                         f"pods[{pod.name}].spec")
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Gang",
            "metadata": {"name": definition.gang, "labels": {GROUP_LABEL: _label(definition.row)}},
            "spec": {"minMember": definition.min_member, "members": members,
                     **({"scheduleTimeoutSeconds": definition.timeout} if definition.timeout else {}),
                     **_topology(definition.row.annotations)}}
    try:
        gang = gang_services.create_gang(ns.name, body, generated)
    except ServiceError as exc:
        raise exc.with_errors([(_pod_path(e["field"], waiting), e["reason"]) for e in exc.errors]) from exc
    consumers = dict(GangMember.objects.filter(gang=gang).values_list("name", "consumer_id"))
    for pod in waiting:
        pod.consumer_id, pod.gate = consumers.get(pod.name), Gate.NONE
    Workload.objects.bulk_update(waiting, ["consumer", "gate"])
    row = definition.row
    if row.kind == Kind.PODGROUP:
        row.gang = gang
    row.resource_version += 1
    row.save(update_fields=["gang", "resource_version"])
    return True


def _topology(annotations: dict) -> dict:
    """KAI Scheduler's placement annotations on the group (``kai.scheduler/topology-required-placement``:
    every pod in one domain of that node label; ``-preferred-placement``: ideally in one of that narrower
    one) as the gang's topology, the required level the wider."""
    required, preferred = (annotations.get(f"{KAI_TOPOLOGY}-{k}-placement") or None for k in ("required",
                                                                                               "preferred"))
    levels = [level for level in (required, preferred) if level]
    if not levels:
        return {}
    return {"topology": {"levels": list(dict.fromkeys(levels)), **({"required": required} if required else {}),
                         **({"preferred": preferred} if preferred else {})}}


def check_annotations(annotations: dict) -> None:
    """The placement annotations, checked when the group is written (not when its last pod comes)."""
    topology = _topology(annotations).get("topology")
    if topology is None:
        return
    errors = Topology.from_dict(topology).errors("topology")
    if errors:
        raise Invalid([(f"metadata.annotations[{KAI_TOPOLOGY}-required-placement]",
                           "; ".join(reason for _, reason in errors))])


def _pod_path(field: str, pods: list[Workload]) -> str:
    """A gang's member path (``spec.members[3].metadata.labels[...]``) in terms of the pod it is: its pod
    template's field for a workload's pod, ``pods[<name>]...`` for a pod of its own."""
    match = _MEMBER.match(field)
    if match is None or int(match.group(1)) >= len(pods):
        return field
    pod, rest = pods[int(match.group(1))], match.group(2)
    in_pod = rest if rest.startswith("metadata.") else f"spec.{rest}"
    return f"spec.template.{in_pod}" if pod.owner_id else f"pods[{pod.name}].{in_pod}"


def form_all(row: Workload) -> None:
    """Every group a new PodGroup or Workload defines, from the pods already waiting for it."""
    _lock_group(row.namespace, row.kind, row.name)
    prefix = f"{row.kind}/{row.name}"
    groups = (Workload.objects.filter(namespace=row.namespace, kind=Kind.POD, gate=Gate.POD_GROUP)
              .filter(group__startswith=f"{prefix}/") | Workload.objects.filter(
                  namespace=row.namespace, kind=Kind.POD, gate=Gate.POD_GROUP, group=prefix))
    for group in sorted(set(groups.values_list("group", flat=True))):
        form(row.namespace, group)


def _label(row: Workload) -> str:
    return f"{row.kind}.{row.name}"[:63]


def gangs_of(row: Workload) -> list[Gang]:
    return list(Gang.objects.filter(namespace=row.namespace, **{f"labels__{GROUP_LABEL}": _label(row)})
                .order_by("name"))


def delete(row: Workload) -> None:
    """The group's gangs (their members' consumers and claims) and the group; its pods wait again."""
    for gang in gangs_of(row):
        gang_services.delete_gang(gang.id)  # deletes the members' consumers: their pods' links go NULL
    prefix = f"{row.kind}/{row.name}"
    pods = Workload.objects.filter(namespace=row.namespace, kind=Kind.POD, wanted_claims__gt=0)
    pods = pods.filter(group=prefix) | pods.filter(group__startswith=f"{prefix}/")
    for consumer_id in pods.filter(consumer__isnull=False).values_list("consumer_id", flat=True):
        consumer_services.delete_consumer(consumer_id)  # a basic group's pods had consumers of their own
    pods.update(gate=Gate.POD_GROUP, consumer=None)
    row.delete()
