"""The cluster side: discovery, list, watch and writes over the official ``kubernetes`` client.

Everything goes through ``ApiClient.call_api`` on raw JSON rather than the typed ``ResourceV1Api``
models, on purpose:

* the typed models drop fields they do not know, and the agent forwards ResourceSlices to a service
  that must see every field a newer driver publishes (a model from client 35 would silently lose a
  field added in Kubernetes 1.36);
* the typed models reject objects that violate their own (client-side) required-field rules;
* one code path serves ``v1``, ``v1beta2``, ``v1beta1`` and ``v1alpha3`` alike, picked by discovery;
* ``kubernetes.watch.Watch`` ignores BOOKMARK resourceVersions and retries a 410 on its own, while the
  agent needs both: bookmarks to resume cheaply, and a 410 to trigger a relist it controls.

The client still does what it is good at: kubeconfig / in-cluster credentials (including exec plugins
and token refresh), TLS, connection pooling.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("agent.kube")

# dra.k8s.fields.GROUP, spelled out: the agent's image ships the agent package alone (deploy/agent/Dockerfile),
# so it cannot import dra; tests/agent/test_kube_side.py holds the two equal.
RESOURCE_GROUP = "resource.k8s.io"
# Newest first. For each resource the agent uses the newest version the cluster serves: v1 from
# Kubernetes 1.34, v1beta2 in 1.33, v1beta1 in 1.32; DeviceTaintRules exist only in v1alpha3 so far.
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")

__all__ = ["ApiException", "KubeClient", "Resource", "WatchExpired", "WatchFailed", "NODES"]


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): the only way forward is a fresh list."""


class WatchFailed(Exception):
    """The API server ended a watch with an ERROR event other than 410."""

    def __init__(self, code: int | None, reason: str):
        super().__init__(f"watch error {code}: {reason}")
        self.code = code


@dataclass(frozen=True)
class Resource:
    """One kind at one served version: enough to build its URLs."""

    kind: str
    plural: str
    group: str  # "" for the core group
    version: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES = Resource("Node", "nodes", "", "v1")
# The resource.k8s.io kinds the agent reads, by plural; their version comes from discovery.
RESOURCE_KINDS = {
    "resourceslices": ("ResourceSlice", False),
    "deviceclasses": ("DeviceClass", False),
    "devicetaintrules": ("DeviceTaintRule", False),
    "resourceclaims": ("ResourceClaim", True),
}


class KubeClient:
    """Thin JSON-in, JSON-out wrapper over one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: k8s_client.ApiClient, request_timeout: float = 30.0):
        self.api = api_client
        self.request_timeout = request_timeout
        self._open_watches: set = set()  # responses of running watches, closed at shutdown

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, context: str | None = None) -> KubeClient:
        """In-cluster service-account credentials inside a pod; otherwise a kubeconfig
        (``--kubeconfig``, then ``$KUBECONFIG``, then ``~/.kube/config``), like kubectl."""
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = k8s_client.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            log.info("using in-cluster service account credentials for %s", configuration.host)
            return cls(k8s_client.ApiClient(configuration))
        api = k8s_config.new_client_from_config(config_file=kubeconfig, context=context)
        log.info("using kubeconfig %s (context %s) for %s", kubeconfig or os.environ.get("KUBECONFIG")
                 or "~/.kube/config", context or "current", api.configuration.host)
        return cls(api)

    @property
    def host(self) -> str:
        return self.api.configuration.host

    # -- plumbing ---------------------------------------------------------------------------------
    def _call(self, method: str, path: str, query: list[tuple[str, Any]] | None = None,
              body: Any = None, timeout: Any = None) -> Any:
        return self.api.call_api(
            path, method, query_params=query or [], body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
            _request_timeout=timeout if timeout is not None else self.request_timeout,
        )

    # -- discovery --------------------------------------------------------------------------------
    def server_version(self) -> str:
        try:
            return str(self._call("GET", "/version").get("gitVersion", "unknown"))
        except Exception:  # noqa: BLE001 - only used for a log line and the heartbeat
            return "unknown"

    def discover_resources(self) -> dict[str, Resource]:
        """Which version of each resource.k8s.io kind to use: the newest one the cluster serves.

        A kind the cluster does not serve at all (DeviceTaintRules without the alpha feature gate, or a
        cluster without DRA) is absent from the result; the caller decides what that means."""
        try:
            group = self._call("GET", f"/apis/{RESOURCE_GROUP}")
        except ApiException as exc:
            if exc.status == 404:
                log.warning("the cluster serves no %s API group (no DRA): only nodes are synced", RESOURCE_GROUP)
                return {}
            raise
        served = {v.get("version") for v in group.get("versions", [])}
        found: dict[str, Resource] = {}
        for version in RESOURCE_VERSIONS:
            if version not in served:
                continue
            listing = self._call("GET", f"/apis/{RESOURCE_GROUP}/{version}")
            names = {r.get("name") for r in listing.get("resources", [])}
            for plural, (kind, namespaced) in RESOURCE_KINDS.items():
                if plural in names and plural not in found:
                    found[plural] = Resource(kind, plural, RESOURCE_GROUP, version, namespaced)
        return found

    # -- reads ------------------------------------------------------------------------------------
    def list(self, resource: Resource, page_size: int = 500) -> tuple[list[dict], str]:
        """All objects of a kind and the list's resourceVersion, across pages.

        Pages of one list share one snapshot (the continue token pins it), so the result is a consistent
        view at the returned resourceVersion; if the token expires mid-list (410) the whole list starts
        over rather than mixing two snapshots."""
        while True:
            items: list[dict] = []
            token = None
            try:
                while True:
                    query: list[tuple[str, Any]] = [("limit", page_size)]
                    if token:
                        query.append(("continue", token))
                    page = self._call("GET", resource.path(), query)
                    for item in page.get("items") or []:
                        # List items come without apiVersion/kind; the service needs both to convert.
                        item["apiVersion"] = resource.api_version
                        item["kind"] = resource.kind
                        items.append(item)
                    meta = page.get("metadata") or {}
                    token = meta.get("continue")
                    if not token:
                        return items, str(meta.get("resourceVersion", ""))
            except ApiException as exc:
                if exc.status == 410 and token:
                    log.info("%s list: continue token expired after %d objects, listing again",
                             resource.plural, len(items))
                    continue
                raise

    def watch(self, resource: Resource, resource_version: str, timeout_seconds: int) -> Iterator[dict]:
        """Events after ``resource_version`` as ``{"type", "object"}``, BOOKMARKs included.

        Ends normally when the server closes the watch (after ``timeout_seconds``); raises
        :class:`WatchExpired` on a 410 and :class:`WatchFailed` on other ERROR events. The socket read
        timeout is longer than the server-side timeout, so a dead connection is noticed rather than
        waited on forever."""
        query = [("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_seconds)]
        resp = self.api.call_api(
            resource.path(), "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
            _request_timeout=(10, timeout_seconds + 30),
        )
        self._open_watches.add(resp)
        try:
            for line in _iter_lines(resp):
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = status.get("code")
                    if code == 410:
                        raise WatchExpired(status.get("message", "resourceVersion too old"))
                    raise WatchFailed(code, f"{status.get('reason')}: {status.get('message')}")
                yield event
        finally:
            self._open_watches.discard(resp)
            resp.release_conn()

    def close_watches(self) -> None:
        """Unblock threads sitting in a watch read, for a prompt shutdown."""
        for resp in list(self._open_watches):
            # urllib3 >= 2.3 can shut the socket from another thread; close() is the fallback. Best effort.
            with contextlib.suppress(Exception):
                getattr(resp, "shutdown", resp.close)()

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict:
        obj = self._call("GET", resource.path(namespace, name))
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        return obj

    # -- writes (ResourceClaims only) ---------------------------------------------------------------
    def replace(self, resource: Resource, obj: dict) -> dict:
        """PUT the object; its metadata.resourceVersion makes it conditional (409 when stale)."""
        meta = obj["metadata"]
        return self._call("PUT", resource.path(meta.get("namespace"), meta["name"]), body=obj)

    def replace_status(self, resource: Resource, obj: dict) -> dict:
        """PUT the status subresource; conditional on metadata.resourceVersion like :meth:`replace`."""
        meta = obj["metadata"]
        return self._call("PUT", resource.path(meta.get("namespace"), meta["name"], "status"), body=obj)


def _iter_lines(resp) -> Iterator[str]:
    """Split a streamed watch body into JSON lines (one event per line)."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")
