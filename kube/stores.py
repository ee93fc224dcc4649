"""Reading and writing the service's objects for the /k8s door. Each store maps one Kubernetes resource onto
the service's models and services: views call a store, stores call the services that own the writes
(``claims.services``), never the models' save directly."""
from __future__ import annotations

from django.db.models import Model, QuerySet
from django.http import Http404

from claims import k8s as claim_k8s
from claims.api import serializers as claim_render
from claims.models import ClaimEvent, Consumer, Namespace, ResourceClaim, ResourceClaimTemplate
from claims.services import caps
from claims.services import claims as claim_services
from claims.services import consumers as consumer_services
from claims.services import events as ev
from claims.services import preemption as claim_preemption
from claims.services import templates as template_services
from draservice.permissions import access_for, readable_namespaces
from draservice.problems import FieldError
from gangs.api.serializers import render_gang
from gangs.models import Gang
from gangs.services import gangs as gang_services
from inventory.models import DeviceClass, ResourceSlice
from inventory.services import fleet as fleet_objects
from kube import poolstatus, versions
from kube.models import ResourcePoolStatusRequest
from kube.registry import CLUSTER_LABEL, Resource, by_plural
from kube.selectors import filter_labels, matches_no_labels, parse_fields, stored_labels
from kube.status import KubeError, conflict, not_found
from queues.models import Queue, Reservation
from queues.services import queues as queue_services
from queues.services import reservations as reservation_services
from queues.services import status as queue_status

RELEASE = "draservice.io/release"
RELEASE_CONFIRM = "draservice.io/release-confirm"  # POST .../release-confirm, as an annotation (kubectl annotate)
ESTIMATE_MAX = 500  # claims of one page whose start times are estimated


class Store:
    resource: Resource
    model: type[Model]
    change_resource: str | None = None  # its name in the change log, when it can be watched
    anyone_may_create = False  # cluster-scoped kinds are the admins' to write, unless this says otherwise
    # Field selectors: field -> column (upstream supports metadata.name and, when namespaced, .namespace).
    field_columns = {"metadata.name": "name", "metadata.namespace": "namespace__name"}

    def queryset(self) -> QuerySet:
        return self.model.objects.all()  # type: ignore[attr-defined]

    def scoped(self, request, namespace: str | None, params) -> QuerySet:
        qs = self.queryset()
        if self.resource.namespaced:
            if namespace:
                qs = qs.filter(namespace__name=namespace)
            else:
                readable = readable_namespaces(request)
                if readable is not None:
                    qs = qs.filter(namespace__name__in=readable)
        allowed = tuple(f for f in self.field_columns if self.resource.namespaced or f != "metadata.namespace")
        for field, (op, value) in parse_fields(params.get("fieldSelector"), allowed).items():
            if field == "metadata.name" and not self.resource.namespaced:
                qs = self.filter_by_name(qs, op, value)
                continue
            column = self.field_columns[field]
            qs = qs.exclude(**{column: value}) if op == "!=" else qs.filter(**{column: value})
        return self.filter_labels(qs, params.get("labelSelector"))

    def filter_labels(self, qs: QuerySet, selector: str | None) -> QuerySet:
        return filter_labels(qs, selector)

    def filter_by_name(self, qs: QuerySet, op: str, value: str) -> QuerySet:
        return qs.exclude(name=value) if op == "!=" else qs.filter(name=value)

    def may_get(self, request, name: str) -> bool:
        """May this caller read the object ``name`` at all (checked before the lookup, so that a refusal does
        not tell whether it exists)? Namespaced objects are decided by the URL's namespace already."""
        return True

    def get(self, namespace: str | None, name: str):
        qs = self.queryset()
        if self.resource.namespaced:
            qs = qs.filter(namespace__name=namespace)
        obj = qs.filter(name=name).first()
        if obj is None:
            raise not_found(self.resource.qualified, name, self.resource.plural)
        return obj

    def render(self, obj, version: str) -> dict:
        raise NotImplementedError

    def render_many(self, objs: list, version: str) -> list[dict]:
        return [self.render(o, version) for o in objs]

    def canonical(self, part: dict, version: str) -> dict:
        """The managed part of an object as the store would keep it (its defaults), to tell whether a server-side
        apply changes anything (``kube.apply``)."""
        return part

    def create(self, view, namespace: str | None, body: dict):
        raise KubeError(405, 'the server does not allow this method on the requested resource')

    def replace(self, view, obj, body: dict):
        raise KubeError(405, 'the server does not allow this method on the requested resource')

    def delete(self, view, obj) -> None:
        raise KubeError(405, 'the server does not allow this method on the requested resource')

    def tombstone(self, data: dict, namespace: str, version: str) -> dict:
        """A deleted object's last rendering from its change-log tombstone (the row as it was)."""
        meta = {"name": data.get("name"), "namespace": namespace, "uid": str(data.get("uid") or ""),
                "resourceVersion": str(data.get("change_seq") or "")}
        return {"apiVersion": self.resource.api_version(version), "kind": self.resource.kind, "metadata": meta}


def _with_version(obj: dict, api_version: str, change_seq: int | None) -> dict:
    obj["apiVersion"] = api_version
    if change_seq is not None:
        obj["metadata"]["resourceVersion"] = str(change_seq)
    return obj


def check_version(resource: Resource, body: dict, current, name: str) -> None:
    """The body's ``metadata.resourceVersion``, when it names one, against the object's current one."""
    wanted = ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("resourceVersion")
    if wanted not in (None, "") and str(wanted) != str(current):
        raise conflict(resource.qualified, name)


def check_precondition(resource: Resource, obj, body: dict) -> str:
    """The body's resourceVersion (a change seq here) against the object's; the ETag to hand the service,
    which re-checks it under its row lock (a change in between is a 409 too)."""
    check_version(resource, body, obj.change_seq, obj.name)
    return obj.etag


def _strip_version(body: dict) -> dict:
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**body, "metadata": meta}


class ClaimStore(Store):
    resource = by_plural("resourceclaims")
    model = ResourceClaim
    change_resource = "resourceclaims"

    def queryset(self):
        return claim_render.claims_queryset(ResourceClaim.objects.order_by("id"))

    def render(self, obj, version: str) -> dict:
        return self.render_many([obj], version)[0]

    def render_many(self, objs: list, version: str) -> list[dict]:
        # Each pending claim's place and estimated start (``kubectl get -o yaml``, the -o wide columns), as a
        # read of one claim at /api/v1 has them; a page larger than ESTIMATE_MAX is ranked without estimates.
        queues = claim_render.queue_status(objs, estimate=len(objs) <= ESTIMATE_MAX)
        out = []
        renderings = [claim_render.render_claim(c, list(c.reservations.all()), queues.get(c.id, {})) for c in objs]
        for claim, rendered in zip(objs, renderings, strict=True):
            rendered["spec"] = versions.claim_spec_out(rendered.get("spec"), version)
            out.append(_with_version(rendered, self.resource.api_version(version), claim.change_seq))
        return out

    def canonical(self, part: dict, version: str) -> dict:
        return {**part, "spec": claim_k8s.claim_spec_to_v1(part.get("spec"), self.resource.api_version(version),
                                                           "spec")}

    def create(self, view, namespace, body):
        view.check_object_permissions(view.request, view.new_claim(body))
        claim = claim_services.create_claims(namespace, [body])[0]
        return self.get(namespace, claim.name)

    def replace(self, view, obj, body):
        etag = check_precondition(self.resource, obj, body)
        body = _strip_version(body)
        annotations = dict((body.get("metadata") or {}).get("annotations") or {})
        release = str(annotations.pop(RELEASE, "")).lower() == "true"
        confirm = str(annotations.pop(RELEASE_CONFIRM, "")).lower() == "true"
        body["metadata"]["annotations"] = annotations
        view.claim_verb = "release" if release or confirm else "edit"
        view.check_object_permissions(view.request, obj)
        claim = claim_services.update_claim(obj.pk, body, if_match=etag)
        if release:  # `kubectl annotate resourceclaim x draservice.io/release=true`
            claim_services.release_claim(claim.pk)
        elif confirm:  # `kubectl annotate resourceclaim x draservice.io/release-confirm=true`
            claim_preemption.confirm(claim.namespace.name, claim.name, lambda c: None,
                                     claim_preemption.confirmer(access_for(view.request), claim.namespace.name))
        return self.get(claim.namespace.name, claim.name)

    def delete(self, view, obj) -> None:
        view.claim_verb = "delete"
        view.check_object_permissions(view.request, obj)
        claim_services.delete_claim(obj.pk)

    def tombstone(self, data: dict, namespace: str, version: str) -> dict:
        out = super().tombstone(data, namespace, version)
        out["spec"] = versions.claim_spec_out(data.get("spec"), version)
        out["status"] = {k: v for k, v in (("phase", data.get("phase")), ("cluster", data.get("cluster")),
                                           ("node", data.get("node"))) if v}
        return out


class TemplateStore(Store):
    resource = by_plural("resourceclaimtemplates")
    model = ResourceClaimTemplate
    change_resource = "resourceclaimtemplates"

    def queryset(self):
        return ResourceClaimTemplate.objects.select_related("namespace").order_by("id")

    def render(self, obj, version: str) -> dict:
        rendered = claim_render.render_template(obj)
        rendered["spec"] = versions.template_spec_out(rendered.get("spec"), version)
        return _with_version(rendered, self.resource.api_version(version), obj.change_seq)

    def canonical(self, part: dict, version: str) -> dict:
        return {**part, "spec": claim_k8s.template_spec_to_v1(part.get("spec") or {},
                                                              self.resource.api_version(version), "spec")}

    def create(self, view, namespace, body):
        template = template_services.create_template(namespace, body)
        return self.get(namespace, template.name)

    def replace(self, view, obj, body):
        etag = check_precondition(self.resource, obj, body)
        template = template_services.update_template(obj.pk, _strip_version(body), if_match=etag)
        return self.get(template.namespace.name, template.name)

    def delete(self, view, obj) -> None:
        template_services.delete_template(obj.pk)


class ConsumerStore(Store):
    resource = by_plural("consumers")
    model = Consumer
    change_resource = "consumers"

    def queryset(self):
        return Consumer.objects.select_related("namespace").order_by("id")

    def render(self, obj, version: str) -> dict:
        return _with_version(claim_render.render_consumer(obj), self.resource.api_version(version), obj.change_seq)

    def create(self, view, namespace, body):
        consumer = consumer_services.create_consumer(namespace, body)
        return self.get(namespace, consumer.name)

    def delete(self, view, obj) -> None:
        consumer_services.delete_consumer(obj.pk)


class NamespaceStore(Store):
    resource = by_plural("namespaces")
    model = Namespace

    def scoped(self, request, namespace, params):
        qs = super().scoped(request, namespace, params).order_by("id")
        allowed = readable_namespaces(request)
        return qs if allowed is None else qs.filter(name__in=allowed)

    def may_get(self, request, name: str) -> bool:
        allowed = readable_namespaces(request)
        return allowed is None or name in allowed

    def render(self, obj, version: str) -> dict:
        meta = {"name": obj.name, "uid": f"ns-{obj.pk}", "resourceVersion": "1",
                "creationTimestamp": claim_render.ts(obj.created_at)}
        if obj.labels:
            meta["labels"] = obj.labels
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta, "status": {"phase": "Active"}}


def _split_cluster(name: str) -> tuple[str, str]:
    cluster, _, rest = name.partition(".")
    if not rest:
        raise Http404
    return cluster, rest


class ClusterObjectStore(Store):
    """Inventory objects of the whole fleet. One cluster's objects are named ``<cluster>.<name>`` here and carry
    the ``draservice.io/cluster`` label; fleet-wide ones (cluster NULL: admin DeviceClasses) keep their names."""

    def queryset(self):
        return self.model.objects.select_related("cluster").order_by("id")  # type: ignore[attr-defined]

    def fleet_name(self, obj) -> str:
        return f"{obj.cluster.name}.{obj.name}" if obj.cluster_id else obj.name

    def get(self, namespace, name: str):
        obj = self.queryset().filter(cluster__isnull=True, name=name).first() if self.has_fleet_wide else None
        if obj is None:
            try:
                cluster, rest = _split_cluster(name)
            except Http404:
                raise not_found(self.resource.qualified, name, self.resource.plural) from None
            obj = self.queryset().filter(cluster__name=cluster, name=rest).first()
        if obj is None:
            raise not_found(self.resource.qualified, name, self.resource.plural)
        return obj

    has_fleet_wide = False

    def filter_labels(self, qs, selector):
        # Labels as rendered: the stored object's own, and the cluster's name that the door adds.
        return filter_labels(qs, selector, stored_labels(), {CLUSTER_LABEL: "cluster__name"})

    def filter_by_name(self, qs, op, value):
        try:
            cluster, rest = _split_cluster(value)
            match = qs.filter(cluster__name=cluster, name=rest)
        except Http404:
            match = qs.none()
        if self.has_fleet_wide:
            match = match | qs.filter(cluster__isnull=True, name=value)
        return qs.exclude(pk__in=match.values("pk")) if op == "!=" else match

    def render_object(self, obj, stored: dict, version: str) -> dict:
        out = dict(stored)
        meta = dict(out.get("metadata") or {})
        meta["name"] = self.fleet_name(obj)
        meta.setdefault("uid", f"{self.resource.plural}-{obj.pk}")
        meta["resourceVersion"] = str(getattr(obj, "resource_version", None) or 1)
        meta.setdefault("creationTimestamp", claim_render.ts(getattr(obj, "created_at", None)
                                                             or getattr(obj, "updated_at", None)))
        if obj.cluster_id:
            meta["labels"] = {**(meta.get("labels") or {}), CLUSTER_LABEL: obj.cluster.name}
        out["metadata"] = meta
        out["apiVersion"] = self.resource.api_version(version)
        out["kind"] = self.resource.kind
        return out


class DeviceClassStore(ClusterObjectStore):
    """Fleet-wide DeviceClasses are the admins' to write (the inventory's fleet-object service, as
    ``/api/v1/deviceclasses``); a cluster's own classes come from its agent and are read-only here."""

    resource = by_plural("deviceclasses")
    model = DeviceClass
    has_fleet_wide = True

    def render(self, obj, version: str) -> dict:
        return self.render_object(obj, obj.object, version)

    def create(self, view, namespace, body):
        name = (body.get("metadata") or {}).get("name")
        clusters = sorted(DeviceClass.objects.filter(cluster__isnull=False, name=name).values_list(
            "cluster__name", flat=True)) if name else []
        if clusters:  # a fleet-wide class takes the place of the clusters' own in every claim: never by accident
            raise KubeError(409, f'deviceclasses.resource.k8s.io "{name}" already exists (published by cluster '
                                 f'{", ".join(clusters[:5])}{" and others" if len(clusters) > 5 else ""}): '
                                 "a fleet-wide class of that name would replace theirs for every claim; an admin "
                                 "who means that creates it at POST /api/v1/deviceclasses", "AlreadyExists",
                            {"name": name, "group": "resource.k8s.io", "kind": "deviceclasses"})
        return fleet_objects.create_fleet_object(DeviceClass, _as_v1(body))

    def replace(self, view, obj, body):
        if obj.cluster_id:
            raise KubeError(403, f'deviceclasses.resource.k8s.io "{self.fleet_name(obj)}" belongs to cluster '
                                 f'"{obj.cluster.name}": its agent writes it', "Forbidden")
        check_version(self.resource, body, obj.resource_version, obj.name)
        row, _ = fleet_objects.replace_fleet_object(DeviceClass, obj.name, _as_v1(_strip_version(body)), None)
        return row

    def delete(self, view, obj) -> None:
        if obj.cluster_id:
            raise KubeError(403, f'deviceclasses.resource.k8s.io "{self.fleet_name(obj)}" belongs to cluster '
                                 f'"{obj.cluster.name}": its agent writes it', "Forbidden")
        fleet_objects.delete_fleet_object(DeviceClass, obj.name, None)


def _as_v1(body: dict) -> dict:
    """A DeviceClass has one shape in v1, v1beta2 and v1beta1 (v1alpha3's is the manifest doctor's to mend)."""
    version = str(body.get("apiVersion") or "").rpartition("/")[2]
    return {**body, "apiVersion": "resource.k8s.io/v1"} if version in ("v1beta2", "v1beta1") else body


class ResourceClassStore(Store):
    """resource.k8s.io/v1alpha2 ResourceClass (classic DRA, removed in Kubernetes 1.31): never stored; a
    create gets the manifest doctor's explanation and a v1 DeviceClass skeleton."""

    resource = by_plural("resourceclasses")
    model = DeviceClass

    def create(self, view, namespace, body):
        raise FieldError([("apiVersion", "resource.k8s.io/v1alpha2 (classic DRA) was removed in Kubernetes "
                                         "1.31: write a resource.k8s.io/v1 DeviceClass instead")])


class SliceStore(ClusterObjectStore):
    resource = by_plural("resourceslices")
    model = ResourceSlice

    def render(self, obj, version: str) -> dict:
        return versions.slice_out(self.render_object(obj, obj.object, version), version)


NORMAL_EVENTS = {ev.CREATED, ev.ALLOCATED, ev.RELEASED, ev.LEASE_RENEWED, ev.DELETED, ev.RESERVED, ev.UNRESERVED}


class EventStore(Store):
    """Core v1 Events from the claims' events, so that ``kubectl describe`` shows what happened and why."""

    resource = by_plural("events")
    model = ClaimEvent
    field_columns = {"metadata.name": "id", "metadata.namespace": "namespace",
                     "involvedObject.name": "claim_name", "involvedObject.namespace": "namespace",
                     "involvedObject.uid": "claim_uid", "involvedObject.kind": "_kind"}

    def queryset(self):
        return ClaimEvent.objects.order_by("id")

    def scoped(self, request, namespace, params):
        qs = self.queryset()
        if namespace:
            qs = qs.filter(namespace=namespace)
        else:
            allowed = readable_namespaces(request)
            if allowed is not None:
                qs = qs.filter(namespace__in=allowed)
        for field, (op, value) in parse_fields(params.get("fieldSelector"), tuple(self.field_columns)).items():
            column = self.field_columns[field]
            if column == "_kind":
                qs = qs if (value == "ResourceClaim") != (op == "!=") else qs.none()
                continue
            if column == "id":
                value = value.rpartition(".")[2]
                if not value.isdigit():
                    qs = qs.none() if op == "=" else qs
                    continue
            qs = qs.exclude(**{column: value}) if op == "!=" else qs.filter(**{column: value})
        return qs if matches_no_labels(params.get("labelSelector")) else qs.none()  # events carry no labels

    def get(self, namespace, name):
        event = self.queryset().filter(namespace=namespace, id=name.rpartition(".")[2] if name.rpartition(
            ".")[2].isdigit() else -1).first()
        if event is None:
            raise not_found(self.resource.qualified, name, self.resource.plural)
        return event

    def render(self, obj, version: str) -> dict:
        when = claim_render.ts(obj.created_at)
        warning = obj.type not in NORMAL_EVENTS  # a failed attempt, a removed device, an expired lease...
        return {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{obj.claim_name}.{obj.pk}", "namespace": obj.namespace,
                             "resourceVersion": str(obj.pk), "creationTimestamp": when, "uid": f"event-{obj.pk}"},
                "involvedObject": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "name": obj.claim_name, "namespace": obj.namespace, "uid": str(obj.claim_uid)},
                "reason": obj.reason or obj.type, "message": obj.message, "type": "Warning" if warning else "Normal",
                "source": {"component": "draservice"}, "count": 1, "firstTimestamp": when, "lastTimestamp": when}


class PoolStatusRequestStore(Store):
    """Availability for users: any caller may ask (the answer is bounded by ``spec.limit`` pools and says no
    more than the fleet's device listings already do); the answer is fixed at creation."""

    resource = by_plural("resourcepoolstatusrequests")
    model = ResourcePoolStatusRequest
    anyone_may_create = True

    def queryset(self):
        return ResourcePoolStatusRequest.objects.order_by("id")

    def render(self, obj, version: str) -> dict:
        meta = {"name": obj.name, "uid": str(obj.uid), "resourceVersion": "1", "generation": 1,
                "creationTimestamp": claim_render.ts(obj.created_at)}
        if obj.labels:
            meta["labels"] = obj.labels
        return {"apiVersion": poolstatus.API_VERSION, "kind": "ResourcePoolStatusRequest", "metadata": meta,
                "spec": obj.spec, "status": obj.status}

    def create(self, view, namespace, body):
        return poolstatus.create(body, caps.pool_status_owner(access_for(view.request)))

    def delete(self, view, obj) -> None:
        obj.delete()


class GangStore(Store):
    """draservice.io/v1alpha1 Gang: all-or-nothing placement of its members (the gangs app's services)."""

    resource = by_plural("gangs")
    model = Gang

    def queryset(self):
        return Gang.objects.select_related("namespace").order_by("id")

    def render(self, obj, version: str) -> dict:
        return render_gang(obj)

    def create(self, view, namespace, body):
        gang = gang_services.create_gang(namespace, body)
        return self.get(namespace, gang.name)

    def delete(self, view, obj) -> None:
        gang_services.delete_gang(obj.pk)


class QueueStore(Store):
    """draservice.io/v1alpha1 Queue: fleet-wide, the admins' to write (the queues app's services)."""

    resource = by_plural("queues")
    model = Queue

    def queryset(self):
        return Queue.objects.order_by("id")

    def render_many(self, objs: list, version: str) -> list[dict]:
        statuses = queue_status.statuses(objs)
        return [{**queue_services.rendered(q), "status": statuses[q.id]} for q in objs]

    def render(self, obj, version: str) -> dict:
        return self.render_many([obj], version)[0]

    def create(self, view, namespace, body):
        return queue_services.create_queue(body)

    def replace(self, view, obj, body):
        check_version(self.resource, body, obj.resource_version, obj.name)
        return queue_services.replace_queue(obj.name, _strip_version(body), None)[0]

    def delete(self, view, obj) -> None:
        queue_services.delete_queue(obj.name, None)


class ReservationStore(Store):
    """draservice.io/v1alpha1 Reservation: fleet-wide, the admins' to write; a namespace token reads those it
    may use (the queues app's reservation services)."""

    resource = by_plural("reservations")
    model = Reservation

    def queryset(self):
        return Reservation.objects.order_by("id")

    def scoped(self, request, namespace, params):
        qs = super().scoped(request, namespace, params)
        names = [r.name for r in reservation_services.visible(access_for(request), list(qs))]
        return qs.filter(name__in=names)

    def may_get(self, request, name: str) -> bool:
        """A namespace token may read the reservations it may use, by name (as an RBAC rule listing
        ``resourceNames``): any other name, existing or not, is a 403, so the answer does not tell whether a
        reservation it may not use exists. Other callers read every one (a missing one: 404)."""
        access = access_for(request)
        if access.kind != "namespace":
            return True
        return bool(reservation_services.visible(access, list(Reservation.objects.filter(name=name))))

    def render_many(self, objs: list, version: str) -> list[dict]:
        return reservation_services.rendered_many(objs)

    def render(self, obj, version: str) -> dict:
        return self.render_many([obj], version)[0]

    def create(self, view, namespace, body):
        return reservation_services.create(body)

    def replace(self, view, obj, body):
        check_version(self.resource, body, obj.resource_version, obj.name)
        return reservation_services.replace(obj.name, _strip_version(body), None)[0]

    def delete(self, view, obj) -> None:
        reservation_services.delete(obj.name, None)


STORES: dict[str, Store] = {s.resource.plural: s for s in (
    NamespaceStore(), ClaimStore(), TemplateStore(), ConsumerStore(), DeviceClassStore(), SliceStore(),
    EventStore(), ResourceClassStore(), PoolStatusRequestStore(), GangStore(), QueueStore(), ReservationStore())}
