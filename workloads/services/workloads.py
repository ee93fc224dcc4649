"""Creating, changing and deleting workloads: one transaction each, pods (and their consumers) included.

A Deployment, StatefulSet or Job keeps as many pods as it wants (``spec.desired_pods``): scaling creates or
deletes pods, and a pod's consumer with it, so claims are made or released at once. Choices, where upstream
has controllers that converge over time:

- a changed pod template replaces every pod at once (Deployment: new pod-template-hash names; StatefulSet:
  the same ordinals), as the ``Recreate`` strategy would: there is nothing running to roll;
- a Deployment scaled down deletes pods without devices first, then the newest (as a ReplicaSet prefers
  unscheduled pods); a StatefulSet the highest ordinals;
- a pod that cannot get its consumer (a template or claim that does not exist, no class for an extended
  resource) fails the whole request with the reason (422), instead of a workload that never gets pods;
- deleting a workload's pod makes a replacement (a new consumer: new claims from templates), as the
  ReplicaSet, StatefulSet and Job controllers do.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.http import Http404

from claims import k8s
from claims.services.claims import get_namespace_for_write
from draservice.errors import AlreadyExists, Conflict, Invalid
from workloads import render
from workloads import spec as wspec
from workloads.models import Gate, Kind, Workload
from workloads.services import podgroups
from workloads.services import pods as pod_services

TEMPLATE_HASH_LABEL = "pod-template-hash"
JOB_NAME_LABEL = "job-name"
STS_POD_LABEL = "statefulset.kubernetes.io/pod-name"
GROUP_KINDS = (Kind.PODGROUP, Kind.WORKLOAD)


def _lock(pk: int) -> Workload:
    obj = Workload.objects.select_for_update(of=("self",)).select_related("namespace", "owner").filter(pk=pk).first()
    if obj is None:
        raise Http404  # deleted meanwhile
    return obj


def create(ns_name: str, kind: str, body: dict) -> Workload:
    meta = k8s.parse_metadata(body, namespace=ns_name)
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise Invalid([("spec", "Required value: must be an object")])
    with transaction.atomic():
        ns = get_namespace_for_write(ns_name)
        if Workload.objects.filter(namespace=ns, kind=kind, name=meta["name"]).exists():
            raise AlreadyExists([("metadata.name", f'{kind.lower()}s "{meta["name"]}" already exists')])
        if kind in GROUP_KINDS:
            spec = podgroups.parse(kind, spec)
            podgroups.check_annotations(meta["annotations"])
            template = None
        else:
            template = wspec.template_of(kind, spec, meta)
            wspec.check_counts(kind, spec)
            wspec.check_selector(kind, spec, template)
        try:
            with transaction.atomic():
                obj = Workload.objects.create(namespace=ns, kind=kind, name=meta["name"], labels=meta["labels"],
                                              annotations=meta["annotations"], spec=spec,
                                              wanted_claims=template.wanted_claims if template else 0,
                                              group=template.group if template and kind == Kind.POD else "")
        except IntegrityError as exc:
            raise Conflict(f'{kind.lower()}s "{meta["name"]}" was created concurrently') from exc
        if kind in GROUP_KINDS:
            podgroups.form_all(obj)
        elif kind == Kind.POD:
            assert template is not None
            _start_pod(obj, template, {}, "spec")
        else:
            reconcile(obj)
    return obj


def _start_pod(pod: Workload, template: wspec.PodTemplate, owner_labels: dict, path: str) -> None:
    group = template.group
    if not group:
        pod_services.start(pod, template, owner_labels, path)
        return
    formed = podgroups.is_formed(pod.namespace, group)
    pod_services.start(pod, template, owner_labels, path, Gate.FORMED if formed else Gate.POD_GROUP)
    if pod.gate == Gate.POD_GROUP:
        podgroups.form(pod.namespace, group)


# --------------------------------------------------------------------------------------------- replicas

def reconcile(workload: Workload) -> None:
    """Make the workload's pods what its spec says (the caller's transaction, the workload row locked)."""
    template = wspec.template_of(workload.kind, workload.spec, {})
    thash = wspec.template_hash(workload.spec.get("template"))
    pods = list(workload.pods.select_related("namespace").order_by("id"))
    for pod in pods:
        if pod.template_hash != thash:
            pod_services.delete(pod)
    current = [p for p in pods if p.template_hash == thash]
    want = wspec.desired_pods(workload.kind, workload.spec)
    if len(current) > want or workload.kind == Kind.STATEFULSET:
        surplus = _surplus(workload.kind, current, want)
        for pod in surplus:
            pod_services.delete(pod)
        current = [p for p in current if p not in surplus]
    if len(current) < want:
        for name, ordinal in _new_names(workload, current, want, thash):
            extra = _pod_labels(workload, name, thash)
            pod = pod_services.new_pod(workload.namespace, name, template, owner=workload, ordinal=ordinal,
                                       thash=thash, extra_labels=extra)
            _start_pod(pod, template, workload.labels, "spec.template.spec")


def _surplus(kind: str, pods: list[Workload], want: int) -> list[Workload]:
    if kind == Kind.STATEFULSET:  # the ordinals from want up, highest first
        return sorted((p for p in pods if (p.ordinal or 0) >= want), key=lambda p: -(p.ordinal or 0))
    # Pods still waiting for devices go first (as a ReplicaSet deletes unscheduled pods first), then the newest.
    claims = render.pod_claims(pods)
    ranked = sorted(pods, key=lambda p: (claims[p.id].ready(p), -p.id))
    return ranked[:len(pods) - want]


def _new_names(workload: Workload, current: list[Workload], want: int, thash: str) -> list[tuple[str, int | None]]:
    kind, n = workload.kind, want - len(current)
    out: list[tuple[str, int | None]]
    if kind == Kind.STATEFULSET:
        taken = {p.ordinal for p in current}
        out = [(wspec.pod_name(kind, workload.name, i, thash), i) for i in range(want) if i not in taken]
        return out[:n]
    if kind == Kind.JOB and workload.spec.get("completionMode") == "Indexed":
        taken = {p.ordinal for p in current}
        total = workload.spec.get("completions") or want
        out = [(wspec.indexed_job_name(workload.name, i), i) for i in range(total) if i not in taken]
        return out[:n]
    return [(wspec.pod_name(kind, workload.name, 0, thash), None) for _ in range(n)]


def _pod_labels(workload: Workload, name: str, thash: str) -> dict:
    """The labels upstream's controllers add to their pods."""
    if workload.kind == Kind.DEPLOYMENT:
        return {TEMPLATE_HASH_LABEL: thash}
    if workload.kind == Kind.STATEFULSET:
        return {STS_POD_LABEL: name}
    if workload.kind == Kind.JOB:
        return {JOB_NAME_LABEL: workload.name, "batch.kubernetes.io/job-name": workload.name}
    return {}


# --------------------------------------------------------------------------------------------- replace

def _check_version(obj: Workload, body: dict) -> None:
    wanted = (body.get("metadata") or {}).get("resourceVersion")
    if wanted not in (None, "") and str(wanted) != str(obj.resource_version):
        raise Conflict(f'Operation cannot be fulfilled on {obj.kind.lower()}s "{obj.name}": the object has been '
                       "modified; please apply your changes to the latest version and try again")


def replace(pk: int, body: dict) -> Workload:
    """PUT (and PATCH, which the door turns into the whole object): labels, annotations, and the spec where
    it may change (replicas, the template of a Deployment or StatefulSet, a Job's parallelism or suspend)."""
    with transaction.atomic():
        obj = _lock(pk)
        _check_version(obj, body)
        meta = k8s.parse_metadata(body, namespace=obj.namespace.name)
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise Invalid([("spec", "Required value: must be an object")])
        changed = _without_binding(obj, spec) != _without_binding(obj, obj.spec)
        if changed:
            _check_spec_change(obj, spec, meta)
        obj.labels, obj.annotations = meta["labels"], meta["annotations"]
        obj.resource_version += 1
        if changed:
            obj.spec = spec
            obj.generation += 1
        obj.save()
        if changed and obj.kind in (Kind.DEPLOYMENT, Kind.STATEFULSET, Kind.JOB):
            reconcile(obj)
        elif changed and obj.kind == Kind.PODGROUP:
            podgroups.form_all(obj)
    return obj


def _without_binding(obj: Workload, spec: dict) -> dict:
    """A pod's spec less ``nodeName``, which its rendering adds once its devices are allocated."""
    return {k: v for k, v in spec.items() if k != "nodeName"} if obj.kind == Kind.POD else spec


def _check_spec_change(obj: Workload, spec: dict, meta: dict) -> None:
    if obj.kind == Kind.POD:
        raise Invalid([("spec", "Forbidden: pod updates may not change fields other than labels and "
                                   "annotations here (delete and create the pod)")])
    if obj.kind == Kind.WORKLOAD:
        raise Invalid([("spec", "Invalid value: field is immutable")])
    if obj.kind == Kind.PODGROUP:
        if obj.gang_id:
            raise Invalid([("spec", "Forbidden: the pod group is a gang already; delete and create it to change "
                                       "it")])
        podgroups.parse(obj.kind, spec)
        return
    if obj.kind == Kind.JOB and spec.get("template") != obj.spec.get("template"):
        raise Invalid([("spec.template", "Invalid value: field is immutable")])
    template = wspec.template_of(obj.kind, spec, meta)
    wspec.check_counts(obj.kind, spec)
    wspec.check_selector(obj.kind, spec, template)


# --------------------------------------------------------------------------------------------- delete

def delete(pk: int) -> None:
    """The workload, its pods and their consumers (claims made for them released and deleted). A pod of a
    workload is replaced, as its controller would."""
    with transaction.atomic():
        # A workload's row before its pods', as scaling locks them: a pod deleted while its workload scales
        # waits instead of deadlocking.
        owner_id = Workload.objects.filter(pk=pk).values_list("owner_id", flat=True).first()
        owner = _lock(owner_id) if owner_id else None
        obj = _lock(pk)
        if obj.kind in GROUP_KINDS:
            podgroups.delete(obj)
            return
        for pod in obj.pods.select_related("namespace").order_by("id"):
            pod_services.delete(pod)
        pod_services.delete(obj) if obj.kind == Kind.POD else obj.delete()
        if owner is not None:
            reconcile(owner)
