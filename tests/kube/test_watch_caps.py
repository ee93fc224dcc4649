"""The watch server's caps and routing, without a service: which requests are watches, and when a new watch
is refused (per token, per process)."""
from __future__ import annotations

import pytest

from kube.watch_server import WatchServer, is_watch


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/k8s/apis/resource.k8s.io/v1/resourceclaims", b"watch=1", True),
    ("GET", "/k8s/apis/resource.k8s.io/v1/namespaces/a/resourceclaims", b"watch=true&resourceVersion=5", True),
    ("GET", "/k8s/api/v1/namespaces/a/pods", b"labelSelector=x&watch=True", True),
    ("GET", "/k8s/apis/resource.k8s.io/v1/resourceclaims", b"watch=false", False),
    ("GET", "/k8s/apis/resource.k8s.io/v1/resourceclaims", b"", False),
    ("POST", "/k8s/apis/resource.k8s.io/v1/namespaces/a/resourceclaims", b"watch=1", False),
    ("GET", "/api/v1/namespaces/a/resourceclaims", b"watch=1", False),  # the REST API has no watches
])
def test_only_get_watch_requests_under_k8s_are_watches(method, path, query, expected):
    assert is_watch({"method": method, "path": path, "query_string": query}) is expected


def test_a_watch_beyond_the_token_cap_or_the_process_cap_is_refused():
    server = WatchServer(max_watches=3, per_token=2, threads=1)
    try:
        assert server._refusal("token:1") is None
        server.holders["token:1"] = 2
        server.active = 2
        assert "KUBE_MAX_WATCHES_PER_TOKEN" in server._refusal("token:1")
        assert server._refusal("token:2") is None  # another token is not held back by this one's watches
        server.active = 3
        assert "this watch server process (3)" in server._refusal("token:2")
    finally:
        server.pool.shutdown()
