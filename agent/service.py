"""The service side: the draservice HTTP API, spoken with the agent's cluster token.

Errors are sorted into the two kinds the callers act on differently:

* :class:`ServiceUnavailable` - the service is down, overloaded or misconfigured for us (connection
  errors, timeouts, 5xx, 429, and also 401/403/404-on-the-cluster, which an operator fixes without
  restarting the agent): keep the change, back off, try again;
* :class:`ServiceRejected` - the service understood the request and refuses this object (400/409/422):
  retrying the same bytes cannot help; log it with the service's problem detail and move on.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

log = logging.getLogger("agent.service")


class ServiceError(Exception):
    def __init__(self, message: str, status: int | None = None, problem: dict | None = None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}


class ServiceUnavailable(ServiceError):
    """Worth retrying later, unchanged."""


class ServiceRejected(ServiceError):
    """The service refuses this request; retrying it unchanged cannot succeed."""


class TokenSource:
    """The bearer secret, from a file (a mounted Secret, re-read when it changes so a rotated token is
    picked up without a restart) or from a fixed string."""

    def __init__(self, token: str | None = None, path: str | None = None):
        if not token and not path:
            raise ValueError("a service token is required (DRASERVICE_TOKEN or --token-file)")
        self._token = (token or "").strip()
        self._path = path
        self._signature: tuple | None = None

    def get(self) -> str:
        if self._path:
            # A Secret volume is updated by swapping a symlink: the inode changes, so does this signature.
            st = os.stat(self._path)
            signature = (st.st_ino, st.st_mtime_ns, st.st_size)
            if signature != self._signature:
                with open(self._path, encoding="utf-8") as fh:
                    self._token = fh.read().strip()
                if self._signature is not None:
                    log.info("service token file %s changed; using the new token", self._path)
                self._signature = signature
        return self._token


class ServiceClient:
    def __init__(self, base_url: str, cluster: str, token: TokenSource, *, timeout: float = 30.0,
                 user_agent: str = "draservice-agent", ca_certs: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.cluster = cluster
        self.token = token
        self.timeout = timeout
        self.user_agent = user_agent
        # Retries are ours (with backoff and the dirty set), not urllib3's: retries=False.
        kwargs: dict[str, Any] = {"retries": False, "maxsize": 4}
        if ca_certs:
            kwargs["ca_certs"] = ca_certs
        self.http = urllib3.PoolManager(**kwargs)

    # -- plumbing ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, query: dict | None = None,
                headers: dict | None = None, timeout: float | None = None,
                missing_ok: bool = False) -> Any:
        url = self.base_url + path + (f"?{urlencode(query)}" if query else "")
        try:
            token = self.token.get()
        except OSError as exc:  # the Secret is not mounted (yet): an operator fixes it, the agent waits
            raise ServiceUnavailable(f"cannot read the service token: {exc}") from exc
        hdrs = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                "User-Agent": self.user_agent, **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            hdrs["Content-Type"] = "application/json"
        try:
            resp = self.http.request(method, url, body=data, headers=hdrs,
                                     timeout=urllib3.Timeout(connect=10, read=timeout or self.timeout))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ServiceUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        status = resp.status
        payload = _decode(resp.data)
        if 200 <= status < 300:
            return payload
        if status == 404 and missing_ok:
            return None
        problem = payload if isinstance(payload, dict) else {"detail": str(payload)[:500]}
        message = f"{method} {path}: HTTP {status}: {_problem_text(problem)}"
        if status in (400, 409, 413, 422):
            raise ServiceRejected(message, status, problem)
        # 401/403/404 land here too: a revoked token or an unregistered cluster is fixed by an operator
        # while the agent keeps its changes and retries.
        raise ServiceUnavailable(message, status, problem)

    def close(self) -> None:
        """Close pooled keep-alive connections (at shutdown: the service need not keep them open).
        Each pool is closed explicitly: recent urllib3 releases no longer do it in ``PoolManager.clear()``."""
        for key in list(self.http.pools.keys()):
            pool = self.http.pools.get(key)
            if pool is not None:
                pool.close()
        self.http.clear()

    def _cluster_path(self, *parts: str) -> str:
        return "/api/v1/clusters/" + "/".join(quote(p, safe="") for p in (self.cluster, *parts))

    # -- inventory --------------------------------------------------------------------------------
    def put_inventory(self, state: dict) -> Any:
        # A 5,000-node cluster is tens of MB: give the service time to store it.
        return self.request("PUT", self._cluster_path("inventory"), state, timeout=max(self.timeout, 300))

    def put_slice(self, name: str, obj: dict) -> Any:
        return self.request("PUT", self._cluster_path("resourceslices", name), obj)

    def delete_slice(self, name: str) -> Any:
        return self.request("DELETE", self._cluster_path("resourceslices", name), missing_ok=True)

    def put_node(self, name: str, node: dict) -> Any:
        return self.request("PUT", self._cluster_path("nodes", name), node)

    def delete_node(self, name: str) -> Any:
        return self.request("DELETE", self._cluster_path("nodes", name), missing_ok=True)

    def heartbeat(self, body: dict) -> Any:
        return self.request("POST", self._cluster_path("heartbeat"), body, timeout=10)

    # -- claims -----------------------------------------------------------------------------------
    def _claims_path(self, namespace: str, name: str | None = None) -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/resourceclaims"
        return path + (f"/{quote(name, safe='')}" if name else "")

    def create_claim(self, namespace: str, body: dict, idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": f"{self.cluster}/{idempotency_key}"} if idempotency_key else None
        return self.request("POST", self._claims_path(namespace), body, headers=headers)

    def get_claim(self, namespace: str, name: str) -> Any:
        """The claim, or None when the service has none of that name."""
        return self.request("GET", self._claims_path(namespace, name), missing_ok=True)

    def list_claims(self, label_selector: str, page_size: int = 500) -> list[dict]:
        """Claims in every namespace the token can read, selected by label, across pages."""
        items: list[dict] = []
        token = None
        while True:
            query = {"labelSelector": label_selector, "limit": page_size}
            if token:
                query["continue"] = token
            page = self.request("GET", "/api/v1/resourceclaims", query=query) or {}
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def release_claim(self, namespace: str, name: str) -> Any:
        return self.request("DELETE", self._claims_path(namespace, name), missing_ok=True)

    def report_reserved_for(self, namespace: str, name: str, reserved_for: list) -> Any:
        """A claim being released (a preemption victim): what the cluster's ``reservedFor`` holds; empty, the
        service hands its devices over now."""
        return self.request("POST", self._claims_path(namespace, name) + "/release-confirm",
                            {"reservedFor": reserved_for}, missing_ok=True)


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


def _problem_text(problem: dict) -> str:
    """One line from an application/problem+json body: title, detail and the offending field."""
    parts = [str(problem.get(k)) for k in ("title", "detail") if problem.get(k)]
    for key in ("field", "path", "pointer"):
        if problem.get(key):
            parts.append(f"at {problem[key]}")
    for err in (problem.get("errors") or [])[:3]:
        if isinstance(err, dict):
            where = err.get("field") or err.get("path") or ""
            parts.append(f"{where}: {err.get('reason') or err.get('detail') or err}")
    return "; ".join(parts) or json.dumps(problem)[:300]
