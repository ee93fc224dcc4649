"""The harness of benchmarks/queue_scenarios.py: a live service (``manage.py serve``, Celery workers and beat,
PostgreSQL, Redis) driven over its HTTP API, with the outcomes read in SQL through the ORM (Django set up on the
service's own database), and the met/MISSED figures each scenario records.

Every scenario starts from a fresh fleet: ``World.reset`` deletes what the previous scenario created (claims,
gangs, queues) over HTTP and replaces the fleet by a new cluster. Nothing happens at import.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from benchmarks._live import Client

GPU = "gpu.nvidia.com"
MIG = "mig.nvidia.com"


@dataclass
class Figure:
    scenario: str
    name: str
    got: object
    expected: str
    met: bool
    timing: bool = False  # printed with the load average beside it

    def line(self) -> str:
        load = f"  (load {os.getloadavg()[0]:.2f})" if self.timing else ""
        return f"  [{'met' if self.met else 'MISSED'}] {self.scenario}: {self.name} = {self.got} " \
               f"(expected {self.expected}){load}"


def queue_body(name: str, *, namespaces=(), parent=None, gpus=None, borrowing=None, lending=None, **spec) -> dict:
    quotas = spec.pop("quotas", None)
    if quotas is None and gpus is not None:
        devices = {"nominal": gpus}
        if borrowing is not None:
            devices["borrowingLimit"] = borrowing
        if lending is not None:
            devices["lendingLimit"] = lending
        quotas = [{"deviceClassName": GPU, "devices": devices}]
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"namespaces": list(namespaces), **({"parent": parent} if parent else {}),
                     **({"quotas": quotas} if quotas is not None else {}), **spec}}


def gpu_claim(name: str, count: int = 1, device_class: str = GPU, selectors=None) -> dict:
    exactly: dict = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def mig_claim(name: str, profile: str) -> dict:
    return gpu_claim(name, 1, MIG, [f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'])


@dataclass
class World:
    port: int
    token: str
    small: bool = False
    figures: list[Figure] = field(default_factory=list)
    made: list[tuple[str, str]] = field(default_factory=list)  # (collection path, name) to delete at reset
    clusters: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.http = Client(self.port, self.token)

    # --- HTTP ---------------------------------------------------------------------------------------------
    def call(self, method: str, path: str, body=None, ok=(200, 201, 202, 204)) -> dict:
        status, data = self.http.call(method, path, body)
        if status not in ok:
            raise AssertionError(f"{method} {path}: {status} {str(data)[:400]}")
        return data

    def create(self, collection: str, body: dict) -> dict:
        data = self.call("POST", collection, body)
        self.made.append((collection, body["metadata"]["name"]))
        return data

    def queue(self, *bodies: dict) -> None:
        for body in bodies:
            self.create("/api/v1/queues", body)

    def default_preemption(self, **policy) -> None:
        self.call("PATCH", "/api/v1/queues/default", {"spec": {"preemption": policy}})

    def claim(self, namespace: str, name: str, count: int = 1, body: dict | None = None) -> dict:
        return self.create(f"/api/v1/namespaces/{namespace}/resourceclaims", body or gpu_claim(name, count))

    def batch(self, namespace: str, items: list[dict], track: bool = False) -> None:
        """Claims created by the hundred; ``track``: deleted at the next reset (as ``claim``'s are)."""
        collection = f"/api/v1/namespaces/{namespace}/resourceclaims"
        for start in range(0, len(items), 100):
            self.call("POST", f"{collection}/batch", {"items": items[start:start + 100]})
        if track:
            self.made.extend((collection, item["metadata"]["name"]) for item in items)

    def gang(self, namespace: str, name: str, replicas: int, per_member: int) -> None:
        template = f"{name}-x{per_member}"
        self.create(f"/api/v1/namespaces/{namespace}/resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": template},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": GPU, "count": per_member}}]}}}})
        self.create(f"/api/v1/namespaces/{namespace}/gangs", {
            "apiVersion": "draservice.io/v1alpha1", "kind": "Gang", "metadata": {"name": name},
            "spec": {"replicas": replicas, "template": {"resourceClaims": [
                {"name": "gpus", "resourceClaimTemplateName": template}]}}})

    # --- the fleet ----------------------------------------------------------------------------------------
    def reset(self, nodes: list[tuple[str, int]], default_grace: int = 1) -> str:
        """Delete what the last scenario made (newest first: gangs before their templates, queues last) and
        replace the fleet by a new cluster of ``nodes`` ([(demo node type, count)]); returns its name."""
        from inventory import demo

        for collection, name in reversed(self.made):
            self.call("DELETE", f"{collection}/{name}", ok=(200, 202, 204, 404))
        self.made.clear()
        self.wait(lambda: not self.live_claims(), 30)
        for old in self.clusters:
            self.call("DELETE", f"/api/v1/clusters/{old}", ok=(204, 404))
        name = f"s{len(self.clusters)}"
        self.clusters.append(name)
        self.call("POST", "/api/v1/clusters", {"name": name, "labels": {"scenario": name}})
        slices, node_list = [], []
        for node_type, count in nodes:
            for i in range(count):
                node = f"{name}-{node_type}-{i}"
                slices += demo.node_slices(node_type, node)
                node_list.append({"name": node, "labels": {"kubernetes.io/hostname": node}})
        self.call("PUT", f"/api/v1/clusters/{name}/inventory", {"resourceSlices": slices, "nodes": node_list})
        self.default_preemption(graceSeconds=default_grace, minRuntimeSeconds=0, withinQueue="LowerPriority",
                                reclaimWithinCohort="Any")
        return name

    def ensure_classes(self) -> None:
        from inventory import demo

        have = {c["metadata"]["name"] for c in self.call("GET", "/api/v1/deviceclasses?limit=500").get("items", [])}
        for obj in demo.standard_device_classes():
            if obj["metadata"]["name"] not in have:
                self.call("POST", "/api/v1/deviceclasses", obj, ok=(201, 409))

    # --- reading outcomes (SQL) ---------------------------------------------------------------------------
    @staticmethod
    def live_claims() -> int:
        from claims.models import ResourceClaim

        return ResourceClaim.objects.filter(phase__in=["Pending", "Allocated"]).exclude(
            namespace__name__startswith="flood").count()

    @staticmethod
    def allocated(namespace: str) -> int:
        from claims.models import ResourceClaim

        return ResourceClaim.objects.filter(namespace__name=namespace, phase="Allocated").count()

    @staticmethod
    def wait(check, timeout: float, step: float = 0.1) -> float | None:
        """Seconds until ``check()`` is true, or None after ``timeout``."""
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                return None
            time.sleep(step)
        return time.monotonic() - started

    def record(self, scenario: str, name: str, got, expected: str, met: bool, timing: bool = False) -> bool:
        figure = Figure(scenario, name, got, expected, bool(met), timing)
        self.figures.append(figure)
        print(figure.line(), flush=True)
        return figure.met

    def equal(self, scenario: str, name: str, got, expected) -> bool:
        return self.record(scenario, name, got, str(expected), got == expected)

    def at_most(self, scenario: str, name: str, got: float | None, limit: float, timing: bool = True) -> bool:
        shown = "never" if got is None else round(got, 2)
        return self.record(scenario, name, shown, f"<= {round(limit, 2)}", got is not None and got <= limit,
                           timing)
