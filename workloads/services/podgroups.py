"""PodGroups (``scheduling.x-k8s.io/v1alpha1``, the coscheduling plugin's): pods labelled
``scheduling.x-k8s.io/pod-group: <name>`` start together or not at all.

The pods of a group wait (``Gate.POD_GROUP``, no consumer) until the group exists and has ``minMember`` of
them; then all of them become ONE Gang of the gangs app (``create_gang``: member = pod, its consumer made by
the claims app, its claims still named after the pod and labelled with its queue), placed all or nothing by
the gang worker. A gang's members are fixed: pods that come later wait with ``Gate.FORMED``. Deleting the
group deletes the gang (its claims released); its pods wait again for a group of that name.
"""
from __future__ import annotations

from claims.models import Namespace
from draservice.problems import FieldError
from gangs.models import GangMember
from gangs.services import gangs as gang_services
from workloads import spec as wspec
from workloads.models import Gate, Kind, Workload
from workloads.services import pods as pod_services

MAX_TIMEOUT = 7 * 24 * 3600


def parse(spec: dict) -> dict:
    """The PodGroup spec we use: minMember (default 1) and scheduleTimeoutSeconds; minResources is ignored
    (the gang places the pods' own claims)."""
    errors = []
    min_member = spec.get("minMember", 1)
    if not isinstance(min_member, int) or isinstance(min_member, bool) or not 1 <= min_member <= wspec.MAX_REPLICAS:
        errors.append(("spec.minMember", f"Invalid value: {min_member!r}: must be between 1 and "
                                         f"{wspec.MAX_REPLICAS}"))
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                or not 1 <= timeout <= MAX_TIMEOUT):
        errors.append(("spec.scheduleTimeoutSeconds", f"Invalid value: {timeout!r}: must be between 1 and "
                                                       f"{MAX_TIMEOUT}"))
    if errors:
        raise FieldError(errors)
    return spec


def is_formed(ns: Namespace, name: str) -> bool:
    return Workload.objects.filter(namespace=ns, kind=Kind.PODGROUP, name=name, gang__isnull=False).exists()


def form(ns: Namespace, name: str) -> bool:
    """Make the group a gang if it exists, is not one yet and has minMember waiting pods. The caller's
    transaction; the group row is locked first (two pods arriving at once form it once)."""
    group = Workload.objects.select_for_update().filter(namespace=ns, kind=Kind.PODGROUP, name=name).first()
    if group is None or group.gang_id is not None:
        return False
    waiting = list(Workload.objects.select_for_update(of=("self",)).select_related("owner", "namespace")
                   .filter(wspec.pod_group_q(name), namespace=ns, kind=Kind.POD, gate=Gate.POD_GROUP).order_by("name"))
    if len(waiting) < group.spec.get("minMember", 1):
        return False
    members, generated = [], {}
    for pod in waiting:
        template = pod_services.template_of_pod(pod)
        members.append({"name": pod.name, "resourceClaims": template.entries})
        generated[pod.name] = pod_services.generated_for(pod, template, pod.owner.labels if pod.owner else {},
                                                         f"pods[{pod.name}].spec")
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Gang",
            "metadata": {"name": group.name, "labels": {"workloads.draservice.io/pod-group": group.name}},
            "spec": {"minMember": group.spec.get("minMember", 1), "members": members,
                     **({"scheduleTimeoutSeconds": group.spec["scheduleTimeoutSeconds"]}
                        if group.spec.get("scheduleTimeoutSeconds") else {})}}
    gang = gang_services.create_gang(ns.name, body, generated)
    consumers = dict(GangMember.objects.filter(gang=gang).values_list("name", "consumer_id"))
    for pod in waiting:
        pod.consumer_id, pod.gate = consumers.get(pod.name), Gate.NONE
    Workload.objects.bulk_update(waiting, ["consumer", "gate"])
    group.gang = gang
    group.resource_version += 1
    group.save(update_fields=["gang", "resource_version"])
    return True


def delete(group: Workload) -> None:
    """The gang (its members' consumers and claims) and the group; its pods wait for a new group."""
    if group.gang_id:
        gang_services.delete_gang(group.gang_id)
    Workload.objects.filter(wspec.pod_group_q(group.name), namespace=group.namespace, kind=Kind.POD,
                            wanted_claims__gt=0).update(gate=Gate.POD_GROUP, consumer=None)
    group.delete()
