"""Pods: one pod (the user's, or a workload's replica) is one Consumer of the claims app.

A pod that wants devices gets its consumer when it is created: the claims it names are reserved, the claims
from its templates and for its extended resources are made (by the claims app's ``create_consumer``, named
``<pod>-<entry>-<random>``), labelled with the pod's queue. A pod labelled with a pod group waits instead
(``Gate.POD_GROUP``) until its group becomes a gang (``workloads.services.podgroups``). Deleting a pod deletes
its consumer: the claims made for it are released and deleted, the ones it named are unreserved.
"""
from __future__ import annotations

from django.db.models import F

from claims.models import Namespace
from claims.services import consumers as consumer_services
from draservice.errors import Invalid, ServiceError
from inventory.models import DeviceClass
from workloads import spec as wspec
from workloads.models import Gate, Kind, Workload

POD_LABEL = "workloads.draservice.io/pod"  # on the pod's consumer: which pod it is
DEVICECLASS_PREFIX = f"{wspec.DEVICECLASS_DOMAIN}/"  # upstream: any class, by its name


def template_of_pod(pod: Workload) -> wspec.PodTemplate:
    return wspec.template_of(Kind.POD, pod.spec, {"labels": pod.labels, "annotations": pod.annotations})


def extended_classes(resources: set[str], path: str) -> dict[str, str]:
    """resource -> the DeviceClass serving it (``spec.extendedResourceName``; fleet-wide classes first), or a
    422 naming what no class serves."""
    out = {r: r[len(DEVICECLASS_PREFIX):] for r in resources if r.startswith(DEVICECLASS_PREFIX)}
    wanted = sorted(resources - set(out))
    if wanted:
        rows = (DeviceClass.objects.filter(object__spec__extendedResourceName__in=wanted)
                .order_by(F("cluster_id").asc(nulls_first=True), "name").values_list("name", "object"))
        for name, obj in rows:
            out.setdefault(str(((obj or {}).get("spec") or {}).get("extendedResourceName")), name)
    missing = sorted(resources - set(out))
    if missing:
        raise Invalid([(path, f'Invalid value: "{r}": no DeviceClass serves this extended resource (none has '
                                 f'spec.extendedResourceName: {r}); ask an operator for one, or request devices '
                                 "with spec.resourceClaims") for r in missing])
    return out


def generated_for(pod: Workload, template: wspec.PodTemplate, owner_labels: dict,
                  path: str) -> consumer_services.Generated:
    """What the claims made for this pod carry: its name, its queue, its extended resources' claim."""
    inline: tuple[tuple[str, dict], ...] = ()
    if template.extended:
        classes = extended_classes({r for _, r, _ in template.extended}, f"{path}.containers")
        inline = ((wspec.EXTENDED_ENTRY, wspec.extended_claim_spec(template.extended, classes)),)
    return consumer_services.Generated(prefix=pod.name, labels=wspec.claim_labels(owner_labels, template),
                                       inline=inline)


def consumer_body(pod: Workload, template: wspec.PodTemplate) -> dict:
    return {"metadata": {"name": pod.name, "labels": {POD_LABEL: pod.name}},
            "spec": {"resourceClaims": template.entries}}


def start(pod: Workload, template: wspec.PodTemplate, owner_labels: dict, path: str,
          gate: str = Gate.NONE) -> None:
    """Give a pod what it wants: nothing (no devices), a gate (it waits for its group), or its consumer."""
    if template.wanted_claims == 0:
        return
    if gate != Gate.NONE:
        pod.gate = gate
        pod.save(update_fields=["gate"])
        return
    generated = generated_for(pod, template, owner_labels, path)
    try:
        consumer = consumer_services.create_consumer(pod.namespace.name, consumer_body(pod, template), "",
                                                     generated)
    except ServiceError as exc:
        # The claims app words paths for a Consumer body; say them in terms of the pod's spec.
        raise exc.with_errors([(_pod_path(e["field"], path), e["reason"]) for e in exc.errors]) from exc
    pod.consumer, pod.gate = consumer, Gate.NONE
    pod.save(update_fields=["consumer", "gate"])


def _pod_path(field: str, path: str) -> str:
    """A consumer field path (``spec.resourceClaims[0]...``; a generated claim's ``spec.metadata.labels``, which
    come from the pod's labels) as a path in the pod's (or the pod template's) object."""
    if field.startswith("spec.metadata."):
        return path[:-len("spec")] + field[len("spec."):]
    return f"{path}.{field[len('spec.'):]}" if field.startswith("spec.") else field


def new_pod(ns: Namespace, name: str, template: wspec.PodTemplate, *, owner: Workload | None = None,
            ordinal: int | None = None, thash: str = "", extra_labels: dict | None = None) -> Workload:
    return Workload.objects.create(namespace=ns, kind=Kind.POD, name=name,
                                   labels={**template.labels, **(extra_labels or {})},
                                   annotations=template.annotations, spec=template.spec, owner=owner,
                                   ordinal=ordinal, template_hash=thash, wanted_claims=template.wanted_claims,
                                   group=template.group)


def delete(pod: Workload) -> None:
    """The pod and its consumer (the claims app releases and deletes the claims made for it)."""
    if pod.consumer_id:
        consumer_services.delete_consumer(pod.consumer_id)
    pod.delete()
