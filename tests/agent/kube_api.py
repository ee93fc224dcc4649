"""An HTTP server that speaks the parts of the Kubernetes API the agent uses, on a real socket.

It is a small in-memory API server, not a recorder of expected calls: it keeps objects with a global
resourceVersion, an event history and the semantics the agent depends on, so the real ``kubernetes``
client and the real agent code run against it unchanged:

* discovery (``/version``, ``/apis/resource.k8s.io`` and its versions' resource lists), with the served
  versions chosen per test (a v1beta1-only cluster, DeviceTaintRules only in v1alpha3...);
* LIST with ``limit``/``continue`` pagination over one pinned snapshot; list items carry no
  apiVersion/kind, as upstream;
* WATCH (``watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=T``) as chunked JSON
  lines: ADDED/MODIFIED/DELETED replayed from history then live, BOOKMARKs, and ``ERROR`` with a 410
  Status when N is older than the compacted history or when the test expires open watches;
* ResourceClaim GET, PUT (metadata only), PUT ``/status`` (status only) and DELETE with finalizers,
  all conditional on ``metadata.resourceVersion`` (409 Conflict when stale, as upstream).

Tests change the cluster through :meth:`create`, :meth:`update` and :meth:`delete` (what a DRA driver,
the kubelet or kubectl would do) and inspect ``requests`` to see what the agent asked.
"""
from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

GROUP = "resource.k8s.io"
ANY = object()  # in fail(): the query parameter is present, with any value
# plural -> (kind, namespaced, versions that can serve it)
KINDS = {
    "nodes": ("Node", False, ("v1",)),
    "resourceslices": ("ResourceSlice", False, ("v1", "v1beta2", "v1beta1")),
    "deviceclasses": ("DeviceClass", False, ("v1", "v1beta2", "v1beta1")),
    "resourceclaims": ("ResourceClaim", True, ("v1", "v1beta2", "v1beta1")),
    "devicetaintrules": ("DeviceTaintRule", False, ("v1alpha3",)),
}


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeAPIServer:
    def __init__(self, versions=("v1",), bookmark_interval: float = 0.3, token: str | None = None):
        self.token = token  # when set, requests without "Authorization: Bearer <token>" get 401
        self.versions = tuple(versions)  # resource.k8s.io versions served (v1alpha3 adds DeviceTaintRules)
        self.bookmark_interval = bookmark_interval
        self.cond = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[tuple[str, str], dict]] = {p: {} for p in KINDS}
        self.history: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, object)
        self.compacted = 0  # watches from a resourceVersion below this get 410
        self.expiry_epoch = 0  # bumped by expire_watches(): open watches end with 410
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, query) as received
        self.snapshots: dict[str, list[dict]] = {}  # continue token -> remaining items of a paged list
        self.status_hooks: list = []  # callables run (under the lock) before a /status PUT is applied
        self.failures: list[list] = []  # [method, path, query subset, times left]: answer 500 (see fail())
        self.closing = False
        self.httpd = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kube-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> KubeAPIServer:
        self.thread.start()
        return self

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- what the cluster's other actors do -------------------------------------------------------
    def _key(self, obj: dict) -> tuple[str, str]:
        meta = obj["metadata"]
        return meta.get("namespace", ""), meta["name"]

    def _record(self, plural: str, kind: str, obj: dict) -> None:
        self.history.append((int(obj["metadata"]["resourceVersion"]), plural, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def _bump(self, obj: dict) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def create(self, plural: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        with self.cond:
            key = self._key(obj)
            assert key not in self.objects[plural], f"{plural} {key} exists"
            meta = obj["metadata"]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            meta["generation"] = 1
            self._bump(obj)
            self.objects[plural][key] = obj
            self._record(plural, "ADDED", obj)
            return copy.deepcopy(obj)

    def update(self, plural: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        with self.cond:
            key = self._key(obj)
            current = self.objects[plural][key]
            obj["metadata"]["uid"] = current["metadata"]["uid"]
            self._bump(obj)
            self.objects[plural][key] = obj
            self._record(plural, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, plural: str, name: str, namespace: str = "") -> None:
        with self.cond:
            obj = self.objects[plural].get((namespace, name))
            if obj is None:
                return
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    self._bump(obj)
                    self._record(plural, "MODIFIED", obj)
                return
            del self.objects[plural][(namespace, name)]
            self._bump(obj)  # a deletion has its own resourceVersion, carried by the DELETED event
            self._record(plural, "DELETED", obj)

    def get(self, plural: str, name: str, namespace: str = "") -> dict | None:
        with self.cond:
            obj = self.objects[plural].get((namespace, name))
            return copy.deepcopy(obj) if obj else None

    def expire_watches(self) -> None:
        """Compact all history: open watches end with ERROR 410, and resuming from any resourceVersion
        seen so far fails with 410 too, so the client must list again (what etcd compaction does)."""
        with self.cond:
            self.compacted = self.rv  # the current resourceVersion stays watchable, as after compaction
            self.history.clear()
            self.expiry_epoch += 1
            self.cond.notify_all()

    def fail(self, method: str, path: str, times: int = 1, **query) -> None:
        """Answer the next ``times`` matching requests with 500 (an API server having a bad moment).
        ``query`` values must match; ``ANY`` matches any value present, ``None`` an absent parameter."""
        with self.cond:
            self.failures.append([method, path, query, times])

    def failures_left(self) -> int:
        with self.cond:
            return sum(f[3] for f in self.failures)

    def _should_fail(self, method: str, path: str, query: dict) -> bool:
        with self.cond:
            for failure in self.failures:
                m, p, q, left = failure
                if left and m == method and p == path and all(
                        (k in query) if v is ANY else query.get(k) == v for k, v in q.items()):
                    failure[3] -= 1
                    return True
        return False

    def count(self, method: str, path: str, **query) -> int:
        """How many requests matched: ``query`` values are compared with the request's (``None`` =
        the parameter must be absent)."""
        n = 0
        for m, p, q in list(self.requests):
            if m == method and p == path and all(q.get(k) == v for k, v in query.items()):
                n += 1
        return n

    # -- request handling -------------------------------------------------------------------------
    def route(self, path: str):
        """-> (plural, version, namespace, name, subresource) or a discovery marker."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            rest, version = parts[2:], "v1"
            group = ""
        elif len(parts) >= 3 and parts[0] == "apis" and parts[1] == GROUP:
            version, rest, group = parts[2], parts[3:], GROUP
            if version not in self.versions:
                return None
        else:
            return None
        namespace = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest:
            return None
        plural = rest[0]
        if plural not in KINDS or version not in KINDS[plural][2] or (plural == "nodes") != (group == ""):
            return None
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return plural, version, namespace, name, sub

    def api_version(self, plural: str, version: str) -> str:
        return "v1" if plural == "nodes" else f"{GROUP}/{version}"

    def discovery(self, path: str):
        if path == "/version":
            return {"major": "1", "minor": "34", "gitVersion": "v1.34.1-test"}
        if path == f"/apis/{GROUP}":
            return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
                    "versions": [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.versions],
                    "preferredVersion": {"groupVersion": f"{GROUP}/{self.versions[0]}", "version": self.versions[0]}}
        if path.startswith(f"/apis/{GROUP}/") and path.count("/") == 3:
            version = path.rsplit("/", 1)[1]
            if version not in self.versions:
                return None
            resources = []
            for plural, (kind, namespaced, versions) in KINDS.items():
                if plural != "nodes" and version in versions:
                    resources.append({"name": plural, "kind": kind, "namespaced": namespaced,
                                      "verbs": ["get", "list", "watch"]})
                    if plural == "resourceclaims":
                        resources.append({"name": "resourceclaims/status", "kind": kind, "namespaced": True,
                                          "verbs": ["get", "update", "patch"]})
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
                    "resources": resources}
        return None

    def list_page(self, plural, version, namespace, query):
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        with self.cond:
            if token:
                if token not in self.snapshots:
                    return 410, _status(410, "Expired", "the provided continue parameter is too old")
                items, rv = self.snapshots.pop(token)
            else:
                items = [copy.deepcopy(o) for (ns, _), o in sorted(self.objects[plural].items())
                         if namespace is None or ns == namespace]
                for item in items:  # upstream list items carry no apiVersion/kind
                    item.pop("apiVersion", None)
                    item.pop("kind", None)
                rv = str(self.rv)
        meta = {"resourceVersion": rv}
        if limit and len(items) > limit:
            items, rest = items[:limit], items[limit:]
            next_token = uuid.uuid4().hex
            with self.cond:
                self.snapshots[next_token] = (rest, rv)
            meta["continue"] = next_token
        kind = KINDS[plural][0]
        return 200, {"kind": f"{kind}List", "apiVersion": self.api_version(plural, version),
                     "metadata": meta, "items": items}

    def write(self, method, plural, version, namespace, name, sub, body):
        with self.cond:
            current = self.objects[plural].get((namespace or "", name))
            if current is None:
                return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
            if method == "GET":
                obj = copy.deepcopy(current)
                obj["apiVersion"], obj["kind"] = self.api_version(plural, version), KINDS[plural][0]
                return 200, obj
            if method == "DELETE":
                pass
            elif plural != "resourceclaims":
                return 405, _status(405, "MethodNotAllowed", "only resourceclaims are writable here")
            if method == "PUT":
                if sub == "status":
                    for hook in list(self.status_hooks):
                        hook(self, copy.deepcopy(current))
                    current = self.objects[plural][(namespace or "", name)]  # a hook may have changed it
                sent_rv = (body.get("metadata") or {}).get("resourceVersion")
                if sent_rv != current["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict",
                                        f'Operation cannot be fulfilled on resourceclaims "{name}": the object '
                                        f"has been modified; please apply your changes to the latest version")
                new = copy.deepcopy(current)
                if sub == "status":
                    new["status"] = body.get("status") or {}
                else:  # the main resource: metadata may change, spec is immutable, status is ignored
                    for field in ("labels", "annotations", "finalizers"):
                        if field in body["metadata"]:
                            new["metadata"][field] = body["metadata"][field]
                        else:
                            new["metadata"].pop(field, None)
                    if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                        del self.objects[plural][(namespace or "", name)]
                        self._bump(new)
                        self._record(plural, "DELETED", new)
                        return 200, copy.deepcopy(new)
                self._bump(new)
                self.objects[plural][(namespace or "", name)] = new
                self._record(plural, "MODIFIED", new)
                out = copy.deepcopy(new)
                out["apiVersion"], out["kind"] = self.api_version(plural, version), KINDS[plural][0]
                return 200, out
        if method == "DELETE":
            self.delete(plural, name, namespace or "")
            return 200, _status(200, "", "deleted") | {"status": "Success"}
        return 405, _status(405, "MethodNotAllowed", method)

    def _events_after(self, plural, namespace, since):
        return [(rv, t, o) for rv, p, t, o in self.history if p == plural and rv > since
                and (namespace is None or o["metadata"].get("namespace") == namespace)]

    def stream_watch(self, handler, plural, version, namespace, query):
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 300)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + timeout
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(event: dict) -> None:
            data = (json.dumps(event) + "\n").encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        with self.cond:
            epoch = self.expiry_epoch
            expired = since < self.compacted
        try:
            if expired:
                send({"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since}")})
                return
            last_bookmark = time.monotonic()
            while True:
                with self.cond:
                    # Collect, wait and read the current resourceVersion under one lock, so a bookmark
                    # can never claim a resourceVersion whose events this watch has not sent.
                    pending = self._events_after(plural, namespace, since)
                    if not pending and not self.closing and self.expiry_epoch == epoch:
                        wait = min(self.bookmark_interval, deadline - time.monotonic())
                        if wait > 0:
                            self.cond.wait(wait)
                        pending = self._events_after(plural, namespace, since)
                    closing, current_rv = self.closing, self.rv
                    expired = self.expiry_epoch != epoch
                for rv, kind, obj in pending:
                    out = copy.deepcopy(obj)
                    out["apiVersion"], out["kind"] = self.api_version(plural, version), KINDS[plural][0]
                    send({"type": kind, "object": out})
                    since = rv
                if expired:
                    send({"type": "ERROR", "object": _status(410, "Expired", "too old resource version")})
                    break
                if closing or time.monotonic() >= deadline:
                    break
                if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_interval:
                    send({"type": "BOOKMARK", "object": {
                        "kind": KINDS[plural][0], "apiVersion": self.api_version(plural, version),
                        "metadata": {"resourceVersion": str(current_rv)}}})
                    since = max(since, current_rv)
                    last_bookmark = time.monotonic()
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the client went away (agent stopped or shut the socket)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client closing its watch socket is normal here, not worth a traceback


def _handler_for(server: KubeAPIServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output readable
            pass

        def reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def handle_any(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = None
            if self.headers.get("Content-Length"):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw) if raw else None
            if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                return self.reply(401, _status(401, "Unauthorized", "Unauthorized"))
            server.requests.append((method, url.path, query))
            if server._should_fail(method, url.path, query):
                return self.reply(500, _status(500, "InternalError", "injected failure"))
            if method == "GET":
                found = server.discovery(url.path)
                if found is not None:
                    return self.reply(200, found)
            route = server.route(url.path)
            if route is None:
                return self.reply(404, _status(404, "NotFound", f"the server could not find {url.path}"))
            plural, version, namespace, name, sub = route
            if name is None and method == "GET":
                if query.get("watch") in ("true", "1"):
                    return server.stream_watch(self, plural, version, namespace, query)
                return self.reply(*server.list_page(plural, version, namespace, query))
            if name is None:
                return self.reply(405, _status(405, "MethodNotAllowed", method))
            return self.reply(*server.write(method, plural, version, namespace, name, sub, body or {}))

        def do_GET(self):
            self.handle_any("GET")

        def do_PUT(self):
            self.handle_any("PUT")

        def do_DELETE(self):
            self.handle_any("DELETE")

    return Handler
