"""Workloads as Kubernetes objects, with a status that says how many pods have their devices.

We allocate; nothing runs. A pod's ``status.phase`` therefore stays ``Pending`` (``Running`` would be a lie);
its condition ``DevicesAllocated`` says whether every claim it wants is allocated (and ``PodScheduled`` and
``spec.nodeName`` where they are). A workload's ready and available counts are the pods whose devices are
all allocated: that is what this service can vouch for.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from claims.models import Phase, Reservation
from dra.k8s.fields import ts
from gangs.models import Gang
from workloads import spec as wspec
from workloads.models import Gate, Kind, Workload
from workloads.services import podgroups

API_VERSIONS: dict[str, str] = {Kind.POD: "v1", Kind.DEPLOYMENT: "apps/v1", Kind.STATEFULSET: "apps/v1",
                                                Kind.JOB: "batch/v1", Kind.PODGROUP: "scheduling.x-k8s.io/v1alpha1",
                                Kind.WORKLOAD: "scheduling.k8s.io/v1alpha1"}
DEVICES_CONDITION = "DevicesAllocated"


@dataclass
class PodClaims:
    entries: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # entry, claim, phase, node, reason

    def ready(self, pod: Workload) -> bool:
        if pod.gate != Gate.NONE:
            return False
        if pod.wanted_claims == 0:
            return True
        return len(self.entries) >= pod.wanted_claims and all(e[2] == Phase.ALLOCATED for e in self.entries)


def pod_claims(pods: list[Workload]) -> dict[int, PodClaims]:
    """pod id -> its claims, in one query."""
    by_consumer = {p.consumer_id: p.id for p in pods if p.consumer_id}
    out = {p.id: PodClaims() for p in pods}
    rows = (Reservation.objects.filter(consumer_id__in=list(by_consumer)).order_by("id")
            .values_list("consumer_id", "entry", "claim__name", "claim__phase", "claim__node", "claim__reason"))
    for consumer_id, entry, name, phase, node, reason in rows:
        out[by_consumer[consumer_id]].entries.append((entry, name, phase, node, reason))
    return out


def _meta(obj: Workload) -> dict:
    meta: dict = {"name": obj.name, "namespace": obj.namespace.name, "uid": str(obj.uid),
            "resourceVersion": str(obj.resource_version), "creationTimestamp": ts(obj.created_at)}
    if obj.kind != Kind.POD:
        meta["generation"] = obj.generation
    if obj.labels:
        meta["labels"] = obj.labels
    if obj.annotations:
        meta["annotations"] = obj.annotations
    owner = obj.owner
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": API_VERSIONS[owner.kind], "kind": owner.kind, "name": owner.name,
                                    "uid": str(owner.uid), "controller": True, "blockOwnerDeletion": True}]
    return meta


def _condition(kind: str, ok: bool, reason: str, message: str, when) -> dict:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message,
            "lastTransitionTime": ts(when)}


def pod_status(pod: Workload, claims: PodClaims) -> dict:
    n, allocated = pod.wanted_claims, sum(1 for e in claims.entries if e[2] == Phase.ALLOCATED)
    if pod.gate == Gate.POD_GROUP:
        reason, message = "WaitingForPodGroup", "waiting for its pod group to have minMember pods"
    elif pod.gate == Gate.FORMED:
        reason, message = "PodGroupFormed", "its pod group became a gang before this pod came: a gang's members " \
                                            "are fixed (delete and create the group to include it)"
    elif n == 0:
        reason, message = "NoDevices", "the pod asks for no devices"
    elif claims.ready(pod):
        reason, message = "Allocated", f"all {n} claims allocated"
    else:
        waiting = next((e for e in claims.entries if e[2] != Phase.ALLOCATED), None)
        why = f": claim {waiting[1]} is {waiting[2]} ({waiting[4]})" if waiting else ""
        reason, message = "WaitingForDevices", f"{allocated}/{n} claims allocated{why}"
    ready = claims.ready(pod)
    nodes = {e[3] for e in claims.entries if e[2] == Phase.ALLOCATED and e[3]}
    status: dict = {"phase": "Pending", "reason": reason, "message": message,
                    "conditions": [_condition(DEVICES_CONDITION, ready, reason, message, pod.created_at),
                                   _condition("PodScheduled", ready and len(nodes) <= 1, reason, message,
                                              pod.created_at)]}
    generated = [{"name": e[0], "resourceClaimName": e[1]} for e in claims.entries
                 if e[0] != wspec.EXTENDED_ENTRY and e[1].startswith(f"{pod.name}-{e[0]}-")]
    if generated:
        status["resourceClaimStatuses"] = generated
    extended = next((e for e in claims.entries if e[0] == wspec.EXTENDED_ENTRY), None)
    if extended:
        template = wspec.template_of(Kind.POD, pod.spec, {"labels": pod.labels})
        containers = pod.spec.get("containers") or []
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended[1], "requestMappings": [
            {"containerName": containers[int(req.split("-")[1])].get("name", ""), "resourceName": resource,
             "requestName": req} for req, resource, _ in template.extended]}
    return status


def _pod(pod: Workload, claims: PodClaims) -> dict:
    spec = dict(pod.spec)
    nodes = {e[3] for e in claims.entries if e[2] == Phase.ALLOCATED and e[3]}
    if claims.ready(pod) and len(nodes) == 1:
        spec["nodeName"] = next(iter(nodes))  # where its devices are: the pod is bound there, as by a scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(pod), "spec": spec,
            "status": pod_status(pod, claims)}


def _workload_status(obj: Workload, pods: list[Workload], claims: dict[int, PodClaims]) -> dict:
    thash = wspec.template_hash(obj.spec.get("template"))
    ready = sum(1 for p in pods if claims[p.id].ready(p))
    updated = sum(1 for p in pods if p.template_hash == thash)
    want = wspec.desired_pods(obj.kind, obj.spec)
    if obj.kind == Kind.JOB:
        status: dict = {"active": len(pods), "ready": ready, "startTime": ts(obj.created_at)}
        if obj.spec.get("suspend"):
            status["conditions"] = [_condition("Suspended", True, "JobSuspended", "Job suspended", obj.created_at)]
        return {k: v for k, v in status.items() if v or k == "ready"}
    status = {"observedGeneration": obj.generation, "replicas": len(pods), "updatedReplicas": updated,
              "readyReplicas": ready, "availableReplicas": ready}
    if obj.kind == Kind.DEPLOYMENT:
        if want > ready:
            status["unavailableReplicas"] = want - ready
        status["conditions"] = [_condition("Available", ready >= want, "MinimumReplicasAvailable" if ready >= want
                                           else "MinimumReplicasUnavailable",
                                           f"{ready}/{want} replicas have all their devices", obj.created_at)]
    else:
        status["currentReplicas"] = updated
    return {k: v for k, v in status.items() if v != 0 or k == "replicas"}


def _gang_status(gang: Gang) -> dict:
    phase = {"Placed": "Scheduled", "Failed": "Failed", "Released": "Finished"}.get(str(gang.phase), "Scheduling")
    return {"phase": phase, "scheduled": gang.placed_count, "reason": gang.reason, "message": gang.message,
            "scheduleStartTime": ts(gang.created_at), "gang": gang.name}


def _waiting(obj: Workload) -> dict[str, int]:
    """group -> pods waiting for it, of the groups ``obj`` (a PodGroup or Workload) defines."""
    prefix = f"{obj.kind}/{obj.name}"
    pods = Workload.objects.filter(namespace_id=obj.namespace_id, kind=Kind.POD, gate=Gate.POD_GROUP)
    rows = (pods.filter(group=prefix) | pods.filter(group__startswith=f"{prefix}/")).values_list("group", flat=True)
    out: dict[str, int] = {}
    for group in rows:
        out[group] = out.get(group, 0) + 1
    return out


def _group_status(obj: Workload) -> dict:
    gangs = {g.name: g for g in podgroups.gangs_of(obj)}
    waiting = _waiting(obj)
    if obj.kind == Kind.PODGROUP:
        if gangs:
            return _gang_status(next(iter(gangs.values())))
        n, min_member = waiting.get(f"{Kind.PODGROUP}/{obj.name}", 0), obj.spec.get("minMember", 1)
        return {"phase": "Pending", "scheduled": 0,
                "message": f"{n}/{min_member} pods waiting; the group is placed once minMember pods exist"}
    groups = []
    for entry in obj.spec.get("podGroups") or []:
        prefix = f"{Kind.WORKLOAD}/{obj.name}/{entry.get('name')}"
        mine = [g for n, g in gangs.items() if n == wspec.gang_name(prefix) or n.startswith(
            wspec.gang_name(prefix) + "-")]
        groups.append({"name": entry.get("name"), "policy": "gang" if "gang" in (entry.get("policy") or {})
                       else "basic", "waitingPods": sum(n for g, n in waiting.items() if g == prefix
                                                         or g.startswith(f"{prefix}/")),
                       "gangs": [_gang_status(g) for g in mine]})
    return {"podGroups": groups}


def render_many(objs: list[Workload]) -> list[dict]:
    owners = [o for o in objs if o.kind in (Kind.DEPLOYMENT, Kind.STATEFULSET, Kind.JOB)]
    pods = [o for o in objs if o.kind == Kind.POD]
    children = list(Workload.objects.filter(owner__in=owners).order_by("id")) if owners else []
    claims = pod_claims(pods + children)
    by_owner: dict[int, list[Workload]] = {}
    for child in children:
        by_owner.setdefault(child.owner_id, []).append(child)  # type: ignore[arg-type]
    out = []
    for obj in objs:
        if obj.kind == Kind.POD:
            out.append(_pod(obj, claims[obj.id]))
            continue
        if obj.kind in (Kind.PODGROUP, Kind.WORKLOAD):
            status = _group_status(obj)
        else:
            status = _workload_status(obj, by_owner.get(obj.id, []), claims)
        out.append({"apiVersion": API_VERSIONS[obj.kind], "kind": obj.kind, "metadata": _meta(obj),
                    "spec": obj.spec, "status": status})
    return out
