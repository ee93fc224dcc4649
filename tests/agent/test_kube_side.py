"""The agent's cluster side against the test API server: discovery, list, watch, informer recovery.

These need no service; the end-to-end behaviour (what reaches the service) is in test_sync.py."""
from __future__ import annotations

import copy
import threading
import time

import pytest

from agent.backoff import Backoff
from agent.informer import Informer
from agent.kube import RESOURCE_GROUP, WatchExpired
from dra.k8s.fields import GROUP
from tests.agent.conftest import kube_client_for, node
from tests.agent.kube_api import ANY, KubeAPIServer


def test_the_agent_reads_the_group_the_service_validates():
    # The agent keeps its own copy of the group name (its image has no dra package); the two must agree.
    assert RESOURCE_GROUP == GROUP


def wait_for(predicate, timeout=10.0, interval=0.02, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {message}")


class Recorder:
    def __init__(self):
        self.changes = []
        self.lock = threading.Lock()

    def __call__(self, key, old, new):
        with self.lock:
            self.changes.append((key, "added" if old is None else "deleted" if new is None else "modified"))

    def saw(self, key, what):
        with self.lock:
            return (key, what) in self.changes


@pytest.fixture
def stop():
    event = threading.Event()
    yield event
    event.set()


def start_informer(kube, resource, stop, **kw):
    recorder = Recorder()
    informer = Informer(kube, resource, recorder, stop, **kw)
    informer.start()
    assert informer.synced.wait(10), "informer never completed its first list"
    return informer, recorder


def test_discovery_picks_the_newest_served_version(kube, kube_api):
    found = kube.discover_resources()
    assert {p: r.version for p, r in found.items()} == {
        "resourceslices": "v1", "deviceclasses": "v1", "resourceclaims": "v1"}
    assert kube.server_version() == "v1.34.1-test"


def test_discovery_falls_back_on_an_older_cluster(tmp_path):
    # A 1.32 cluster: resource.k8s.io/v1beta1 only, DeviceTaintRules behind the alpha gate (v1alpha3).
    server = KubeAPIServer(versions=("v1beta1", "v1alpha3"), token="agent-service-account-token").start()
    try:
        kube = kube_client_for(server, tmp_path)
        found = kube.discover_resources()
        assert found["resourceslices"].api_version == "resource.k8s.io/v1beta1"
        assert found["resourceclaims"].version == "v1beta1"
        assert found["devicetaintrules"].version == "v1alpha3"
    finally:
        server.close()


def test_list_pages_one_snapshot_and_labels_items(kube, kube_api, slices):
    for s in slices:
        kube_api.create("resourceslices", s)
    resource = kube.discover_resources()["resourceslices"]
    items, rv = kube.list(resource, page_size=3)
    assert sorted(i["metadata"]["name"] for i in items) == sorted(s["metadata"]["name"] for s in slices)
    assert rv == str(kube_api.rv)
    # Upstream list items have no apiVersion/kind; the service needs them to convert older versions.
    assert all(i["apiVersion"] == "resource.k8s.io/v1" and i["kind"] == "ResourceSlice" for i in items)
    assert kube_api.count("GET", "/apis/resource.k8s.io/v1/resourceslices", limit="3") == 6  # 16 items / 3


def test_watch_streams_events_and_raises_on_410(kube, kube_api, slices):
    resource = kube.discover_resources()["resourceslices"]
    _, rv = kube.list(resource)
    kube_api.create("resourceslices", slices[0])
    events = kube.watch(resource, rv, timeout_seconds=5)
    first = next(events)
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == slices[0]["metadata"]["name"]
    kube_api.expire_watches()
    with pytest.raises(WatchExpired):
        for _ in events:
            pass
    # Starting from a resourceVersion older than the compacted history is a 410 too.
    with pytest.raises(WatchExpired):
        list(kube.watch(resource, rv, timeout_seconds=5))


def test_requests_carry_the_kubeconfig_token(kube_api, tmp_path):
    kube_api.token = "another-token"  # the kubeconfig's token is now wrong
    kube = kube_client_for(kube_api, tmp_path)
    with pytest.raises(Exception) as err:
        kube.discover_resources()
    assert getattr(err.value, "status", None) == 401


def test_informer_follows_adds_updates_and_deletes(kube, kube_api, slices, stop):
    kube_api.create("resourceslices", slices[0])
    resource = kube.discover_resources()["resourceslices"]
    informer, rec = start_informer(kube, resource, stop, watch_timeout=5)
    name0, name1 = slices[0]["metadata"]["name"], slices[1]["metadata"]["name"]
    assert informer.get(name0)["spec"] == slices[0]["spec"]

    kube_api.create("resourceslices", slices[1])
    changed = kube_api.get("resourceslices", name0)
    changed["spec"]["devices"] = changed["spec"]["devices"][:2]
    kube_api.update("resourceslices", changed)
    kube_api.delete("resourceslices", name1)
    wait_for(lambda: rec.saw(name1, "deleted"), message="the delete")
    assert len(informer.get(name0)["spec"]["devices"]) == 2
    assert informer.get(name1) is None
    assert [c for c in rec.changes if c[0] == name1] == [(name1, "added"), (name1, "deleted")]
    assert informer.resource_version == str(kube_api.rv)


def test_informer_relists_on_410_and_reports_what_it_missed(kube, kube_api, slices, stop):
    for s in slices[:3]:
        kube_api.create("resourceslices", s)
    resource = kube.discover_resources()["resourceslices"]
    informer, rec = start_informer(kube, resource, stop, watch_timeout=5)
    path = "/apis/resource.k8s.io/v1/resourceslices"
    assert kube_api.count("GET", path, watch=None) == 1

    # While the watch is cut off by compaction, a slice is deleted and one is added: the relist must
    # notice both, because no watch event will ever carry them.
    with kube_api.cond:
        kube_api.expire_watches()
        gone = slices[0]["metadata"]["name"]
        del kube_api.objects["resourceslices"][("", gone)]
        kube_api.rv += 1
        kube_api.history.clear()
        new = copy.deepcopy(slices[5])
        new["metadata"].update(uid="u-5", resourceVersion=str(kube_api.rv))
        kube_api.objects["resourceslices"][("", new["metadata"]["name"])] = new
        kube_api.compacted = kube_api.rv

    wait_for(lambda: rec.saw(gone, "deleted") and rec.saw(new["metadata"]["name"], "added"), message="relist")
    assert kube_api.count("GET", path, watch=None) == 2
    assert informer.get(gone) is None
    # and it watches again from the new list's resourceVersion
    wait_for(lambda: kube_api.count("GET", path, watch="true", resourceVersion=str(kube_api.rv)) >= 1,
             message="watch from the relist's resourceVersion")


def test_informer_resumes_from_bookmarks_without_relisting(kube, kube_api, slices, stop):
    kube_api.create("resourceslices", slices[0])
    resource = kube.discover_resources()["resourceslices"]
    # watch_timeout=1: the server ends every watch after 1-2 s and the informer must resume
    informer, rec = start_informer(kube, resource, stop, watch_timeout=1)
    listed_rv = informer.resource_version
    # Other kinds move the global resourceVersion on; only bookmarks tell the slice watch about it.
    for i in range(5):
        kube_api.create("nodes", node(f"n{i}"))
    moved = str(kube_api.rv)
    wait_for(lambda: informer.resource_version == moved, message="a bookmark")
    path = "/apis/resource.k8s.io/v1/resourceslices"
    wait_for(lambda: kube_api.count("GET", path, watch="true", resourceVersion=moved) >= 1, timeout=6,
             message="a watch resumed from the bookmark's resourceVersion")
    assert kube_api.count("GET", path, watch="true", resourceVersion=listed_rv) >= 1
    assert kube_api.count("GET", path, watch=None) == 1, "a timed-out watch must resume, not relist"


def test_informer_never_publishes_a_half_read_list(kube, kube_api, slices, stop):
    for s in slices:
        kube_api.create("resourceslices", s)
    resource = kube.discover_resources()["resourceslices"]
    path = "/apis/resource.k8s.io/v1/resourceslices"
    # Pages of 4: the first page succeeds, the second fails - twice in a row.
    kube_api.fail("GET", path, times=2, **{"continue": ANY})
    rec = Recorder()
    original_list = kube.list
    kube.list = lambda res, page_size=500: original_list(res, page_size=4)
    informer = Informer(kube, resource, rec, stop, watch_timeout=5, backoff=Backoff(base=0.05, cap=0.2))
    informer.start()
    wait_for(lambda: kube_api.failures_left() == 0, message="both failures to be served")
    assert not informer.synced.is_set() and informer.cache == {} and rec.changes == [], \
        "the first page of a failed list was published"
    assert informer.synced.wait(10)
    assert len(rec.changes) == len(slices) and len(informer.cache) == len(slices)


def test_informer_keeps_its_cache_while_the_api_server_is_down(kube, kube_api, slices, stop):
    kube_api.create("resourceslices", slices[0])
    resource = kube.discover_resources()["resourceslices"]
    informer, rec = start_informer(kube, resource, stop, watch_timeout=1, backoff=Backoff(base=0.05, cap=0.2))
    path = "/apis/resource.k8s.io/v1/resourceslices"
    kube_api.fail("GET", path, times=3)  # the next requests (watches, then the relist) fail
    kube_api.expire_watches()  # end the open watch, so the informer needs a new request
    wait_for(lambda: kube_api.failures_left() == 0, message="the failures to be served")
    assert informer.get(slices[0]["metadata"]["name"]) is not None
    kube_api.create("resourceslices", slices[1])
    wait_for(lambda: informer.get(slices[1]["metadata"]["name"]) is not None, message="recovery")
