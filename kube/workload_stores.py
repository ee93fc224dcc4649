"""Stores for workloads as users write them (``workloads``): Pods, Deployments, StatefulSets, Jobs and
PodGroups. Writes go through ``workloads.services.workloads`` (which calls the claims app's consumer service
and the gangs app's gang service); reads render the status from the pods' claims (``workloads.render``)."""
from __future__ import annotations

from kube.registry import RESOURCES, Resource
from kube.stores import Store
from kube.workload_watch import DiffWatch
from workloads import render
from workloads.models import Kind, Workload
from workloads.services import workloads as workload_services


def _resource(kind: str) -> Resource:
    return next(r for r in RESOURCES if r.kind == kind)


class WorkloadStore(Store):
    model = Workload
    kind: str = Kind.POD
    watch_class = DiffWatch  # not in the change log: renderings compared every second

    def queryset(self):
        return Workload.objects.filter(kind=self.kind).select_related("namespace", "owner", "gang").order_by("id")

    def render(self, obj, version: str) -> dict:
        return render.render_many([obj])[0]

    def render_many(self, objs: list, version: str) -> list[dict]:
        return render.render_many(objs)

    def create(self, view, namespace, body):
        obj = workload_services.create(namespace, self.kind, body)
        return self.get(namespace, obj.name)

    def replace(self, view, obj, body):
        return self.get(obj.namespace.name, workload_services.replace(obj.pk, body).name)

    def delete(self, view, obj) -> None:
        workload_services.delete(obj.pk)


def _store(kind: str) -> WorkloadStore:
    return type(f"{kind}Store", (WorkloadStore,), {"kind": kind, "resource": _resource(kind)})()


WORKLOAD_STORES: dict[str, Store] = {s.resource.plural: s for s in map(_store, Kind.values)}
