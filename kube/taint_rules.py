"""resource.k8s.io DeviceTaintRule at the door, at v1alpha3 only: the one version Kubernetes 1.35 serves (it
reached v1beta2 and v1 after 1.35). Fleet-wide rules are the admins' to write through the inventory's
fleet-object service (as ``/api/v1/devicetaintrules``); a cluster's own rules come from its agent and are
read-only here, named ``<cluster>.<name>`` as its slices and classes are. A rule taints the devices its
``deviceSelector`` names for the allocator at once (``inventory.services.taints``).

DeviceClasses and DeviceTaintRules are watched by comparing renderings (``kube.workload_watch.DiffWatch``):
they are few. ResourceSlices are not watched yet: a fleet has too many to render every second, and they need
change-log entries of their own."""
from __future__ import annotations

from django.utils import timezone

from inventory.models import DeviceTaintRule
from inventory.services import fleet as fleet_objects
from kube.registry import by_plural
from kube.status import KubeError
from kube.stores import ClusterObjectStore, _strip_version, check_version
from kube.workload_watch import DiffWatch


def _with_time_added(body: dict, stored: dict | None = None) -> dict:
    """Upstream sets ``spec.taint.timeAdded`` on create or update when it is not given; an update that leaves
    the taint as it was keeps the stored time (so a second identical apply changes nothing)."""
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return body
    taint = spec.get("taint")
    if not isinstance(taint, dict) or taint.get("timeAdded"):
        return body
    before = ((stored or {}).get("spec") or {}).get("taint") or {}
    same = {k: v for k, v in before.items() if k != "timeAdded"} == taint and before.get("timeAdded")
    when = before["timeAdded"] if same else timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**body, "spec": {**spec, "taint": {**taint, "timeAdded": when}}}


class DeviceTaintRuleStore(ClusterObjectStore):
    resource = by_plural("devicetaintrules")
    model = DeviceTaintRule
    has_fleet_wide = True
    # Rules are few and not in the change log: renderings compared every second (kube.workload_watch).
    watch_class = DiffWatch

    def render(self, obj, version: str) -> dict:
        return self.render_object(obj, obj.object, version)

    def _own(self, obj) -> None:
        if obj.cluster_id:
            raise KubeError(403, f'devicetaintrules.resource.k8s.io "{self.fleet_name(obj)}" belongs to cluster '
                                 f'"{obj.cluster.name}": its agent writes it', "Forbidden")

    def create(self, view, namespace, body):
        return fleet_objects.create_fleet_object(DeviceTaintRule, _with_time_added(body))

    def replace(self, view, obj, body):
        self._own(obj)
        check_version(self.resource, body, obj.resource_version, obj.name)
        body = _with_time_added(_strip_version(body), obj.object)
        row, _ = fleet_objects.replace_fleet_object(DeviceTaintRule, obj.name, body, None)
        return row

    def delete(self, view, obj) -> None:
        self._own(obj)
        fleet_objects.delete_fleet_object(DeviceTaintRule, obj.name, None)
