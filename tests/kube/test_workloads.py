"""Workloads as users write them, through the /k8s door: Deployments, StatefulSets, Jobs and Pods whose pods
name claims or claim templates become consumers (one per pod); scaling makes or releases claims; deleting
releases them; PodGroups are gangs (all or nothing); extended resources are served by a DeviceClass's
``extendedResourceName``; queue labels and priority classes go onto the claims the pods get."""
from __future__ import annotations

import contextlib
import json
import re
import threading

import pytest
from django.db import connection

from claims.models import Consumer, DeviceAllocation, Phase, ResourceClaim
from claims.services import claims as claim_services
from claims.services import templates as template_services
from draservice import changes
from gangs.models import Gang
from kube import workload_watch
from queues.services import queues as queue_services
from tests.gangs import fleet
from workloads.services import podgroups
from workloads.services import workloads as workload_services

# on_commit work (allocation, gang placement) runs; slow: minutes in all, handed out first under xdist
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
NS = "team"
APPS = f"/k8s/apis/apps/v1/namespaces/{NS}"
CORE = f"/k8s/api/v1/namespaces/{NS}"
BATCH = f"/k8s/apis/batch/v1/namespaces/{NS}"
PG = f"/k8s/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{NS}"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture
def gpus(db):
    """Nine 8xH100 nodes (tests/gangs/fleet.py) and templates gpu1 (1 GPU) and h100x8 (a node's 8)."""
    fleet.load()
    template_services.create_template(NS, fleet.template_body("gpu1", 1))
    template_services.create_template(NS, fleet.template_body("h100x8", 8))


def pod_spec(template: str | None = "gpu1", claim: str | None = None, **extra) -> dict:
    entry = {"name": "gpu", **({"resourceClaimTemplateName": template} if template else {}),
             **({"resourceClaimName": claim} if claim else {})}
    return {"containers": [{"name": "main", "image": "trainer:1", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [entry], **extra}


def deployment(name: str, replicas: int, template: str = "gpu1", labels: dict | None = None) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(template)}}}


def post(client, url: str, body: dict):
    return client.post(url, json.dumps(body), content_type="application/json")


def patch(client, url: str, body: dict, ctype: str = MERGE):
    return client.patch(url, json.dumps(body), content_type=ctype)


def claims_of(prefix: str) -> list[ResourceClaim]:
    return list(ResourceClaim.objects.filter(name__startswith=prefix).order_by("name"))


def test_a_deployment_gets_one_allocated_claim_per_replica_scales_and_releases(admin_client, gpus):
    resp = post(admin_client, f"{APPS}/deployments", deployment("train", 3))
    assert resp.status_code == 201, resp.content
    pods = admin_client.get(f"{CORE}/pods").json()["items"]
    assert len(pods) == 3
    for pod in pods:
        name = pod["metadata"]["name"]
        # <deployment>-<pod-template-hash>-<5 random>, and the claim <pod>-<entry>-<5 random>
        assert re.fullmatch(r"train-[b-z2-9]{8,10}-[a-z0-9]{5}", name), name
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
        claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        assert re.fullmatch(rf"{name}-gpu-[a-z0-9]{{5}}", claim_name)
        assert pod["status"]["phase"] == "Pending"  # we allocate; nothing runs
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["DevicesAllocated"] == "True"
        assert pod["spec"]["nodeName"]
    claims = claims_of("train-")
    assert len(claims) == 3 and {c.phase for c in claims} == {Phase.ALLOCATED}
    dep = admin_client.get(f"{APPS}/deployments/train").json()
    assert dep["status"]["replicas"] == 3 and dep["status"]["readyReplicas"] == 3
    assert dep["status"]["availableReplicas"] == 3

    table = admin_client.get(f"{APPS}/deployments", HTTP_ACCEPT="application/json;as=Table;v=v1;g=meta.k8s.io")
    assert table.json()["rows"][0]["cells"][:2] == ["train", "3/3"]

    resp = patch(admin_client, f"{APPS}/deployments/train", {"spec": {"replicas": 1}})
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"]["replicas"] == 1 and resp.json()["metadata"]["generation"] == 2
    assert len(claims_of("train-")) == 1 and DeviceAllocation.objects.count() == 1
    assert Consumer.objects.count() == 1

    resp = patch(admin_client, f"{APPS}/deployments/train", {"spec": {"replicas": 2}}, STRATEGIC)
    assert resp.status_code == 200 and resp.json()["status"]["readyReplicas"] == 2
    assert admin_client.delete(f"{APPS}/deployments/train").status_code == 200
    assert not claims_of("train-") and DeviceAllocation.objects.count() == 0 and Consumer.objects.count() == 0
    assert admin_client.get(f"{CORE}/pods").json()["items"] == []


def test_a_changed_pod_template_replaces_the_pods_and_a_deleted_pod_is_replaced(admin_client, gpus):
    post(admin_client, f"{APPS}/deployments", deployment("web", 2))
    before = {p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"]}
    body = {"spec": {"template": {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName":
                                                                  "h100x8"}]}}}}
    assert patch(admin_client, f"{APPS}/deployments/web", body, STRATEGIC).status_code == 200
    after = {p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"]}
    assert len(after) == 2 and not before & after
    assert sum(len(c.allocation["devices"]["results"]) for c in claims_of("web-")) == 16
    victim = sorted(after)[0]
    assert admin_client.delete(f"{CORE}/pods/{victim}").status_code == 200
    now = {p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"]}
    assert len(now) == 2 and victim not in now


def test_a_statefulset_names_pods_by_ordinal_and_scales_from_the_top(admin_client, gpus):
    body = deployment("db", 3) | {"kind": "StatefulSet"}
    assert post(admin_client, f"{APPS}/statefulsets", body).status_code == 201
    names = sorted(p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"])
    assert names == ["db-0", "db-1", "db-2"]
    assert patch(admin_client, f"{APPS}/statefulsets/db", {"spec": {"replicas": 1}}).json()["status"] == {
        "observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1,
        "currentReplicas": 1}
    assert [p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"]] == ["db-0"]
    patch(admin_client, f"{APPS}/statefulsets/db", {"spec": {"replicas": 3}})
    assert admin_client.delete(f"{CORE}/pods/db-1").status_code == 200  # replaced, under the same name
    names = sorted(p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"])
    assert names == ["db-0", "db-1", "db-2"] and len(claims_of("db-")) == 3


def test_scaling_down_takes_the_pods_without_devices_first(admin_client, db):
    fleet.load({"c1": fleet.nodes("c1", {"zone-a": {"rack-a1": {"block-1": 2}}})})  # two nodes, 16 GPUs
    template_services.create_template(NS, fleet.template_body("h100x8", 8))
    post(admin_client, f"{APPS}/deployments", deployment("big", 3, "h100x8"))
    pods = sorted(admin_client.get(f"{CORE}/pods").json()["items"], key=lambda p: p["metadata"]["uid"])
    by_reason = sorted(p["status"]["reason"] for p in pods)
    assert by_reason == ["Allocated", "Allocated", "WaitingForDevices"]
    # The oldest pod loses its devices (its claim released): the waiting one gets them.
    oldest = ResourceClaim.objects.filter(name__startswith="big-").order_by("id").first()
    claim_services.release_claim(oldest.id)
    owner = oldest.name.split("-gpu-")[0]
    assert admin_client.get(f"{CORE}/pods/{owner}").json()["status"]["reason"] == "WaitingForDevices"
    resp = patch(admin_client, f"{APPS}/deployments/big", {"spec": {"replicas": 2}})
    assert resp.json()["status"]["readyReplicas"] == 2
    assert admin_client.get(f"{CORE}/pods/{owner}").status_code == 404  # not the newest: the one without devices


def test_a_job_wants_parallelism_pods_and_none_while_suspended(admin_client, gpus):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "etl"},
           "spec": {"parallelism": 2, "completions": 4, "suspend": True,
                    "template": {"spec": pod_spec() | {"restartPolicy": "Never"}}}}
    assert post(admin_client, f"{BATCH}/jobs", job).status_code == 201
    assert not claims_of("etl-")
    resp = patch(admin_client, f"{BATCH}/jobs/etl", {"spec": {"suspend": False}})
    assert resp.json()["status"]["active"] == 2 and resp.json()["status"]["ready"] == 2
    assert all(re.fullmatch(r"etl-[a-z0-9]{5}-gpu-[a-z0-9]{5}", c.name) for c in claims_of("etl-"))
    resp = patch(admin_client, f"{BATCH}/jobs/etl", {"spec": {"template": {"spec": pod_spec("h100x8")}}},
                 STRATEGIC)
    assert resp.status_code == 422 and "immutable" in resp.json()["message"]


def test_an_indexed_job_names_pods_by_index_and_templates_are_checked(admin_client, gpus):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "idx"},
           "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 2,
                    "template": {"metadata": {"labels": {"bad": "not a label value"}}, "spec": pod_spec()}}}
    resp = post(admin_client, f"{BATCH}/jobs", job)
    assert resp.status_code == 422 and "spec.template.metadata.labels" in resp.json()["message"]
    job["spec"]["template"]["metadata"]["labels"] = {"good": "yes"}
    assert post(admin_client, f"{BATCH}/jobs", job).status_code == 201
    names = sorted(p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"])
    assert [n.rsplit("-", 1)[0] for n in names] == ["idx-0", "idx-1"]
    assert all(p["metadata"]["labels"]["job-name"] == "idx" for p in admin_client.get(f"{CORE}/pods").json()["items"])
    patch(admin_client, f"{BATCH}/jobs/idx", {"spec": {"parallelism": 3}})
    names = sorted(p["metadata"]["name"] for p in admin_client.get(f"{CORE}/pods").json()["items"])
    assert [n.rsplit("-", 1)[0] for n in names] == ["idx-0", "idx-1", "idx-2"]
    bad = deployment("nosel", 1)
    del bad["spec"]["selector"]
    assert post(admin_client, f"{APPS}/deployments", bad).status_code == 422
    assert post(admin_client, f"{APPS}/deployments", deployment("neg", -1)).status_code == 422


def test_a_pod_naming_an_existing_claim_reserves_it_and_bad_pods_are_refused(admin_client, gpus):
    claim_services.create_claims(NS, [fleet.claim_body("shared", 1)])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"}, "spec": pod_spec(None, "shared")}
    resp = post(admin_client, f"{CORE}/pods", pod)
    assert resp.status_code == 201, resp.content
    claim = admin_client.get(f"/k8s/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/shared").json()
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p1"]
    assert resp.json()["status"]["conditions"][0]["status"] == "True"
    labelled = patch(admin_client, f"{CORE}/pods/p1", {"metadata": {"labels": {"team": "a"}}}, STRATEGIC)
    assert labelled.status_code == 200 and labelled.json()["metadata"]["labels"] == {"team": "a"}, labelled.content
    changed = patch(admin_client, f"{CORE}/pods/p1", {"spec": {"priorityClassName": "train"}})
    assert changed.status_code == 422 and "pod updates may not change" in changed.json()["message"]
    assert admin_client.delete(f"{CORE}/pods/p1").status_code == 200
    assert ResourceClaim.objects.get(name="shared").phase == Phase.ALLOCATED  # only unreserved: not the pod's
    missing = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p2"}, "spec": pod_spec("nope")}
    resp = post(admin_client, f"{CORE}/pods", missing)
    assert resp.status_code == 422 and "spec.resourceClaims[0].resourceClaimTemplateName" in resp.json()["message"]
    assert not ResourceClaim.objects.filter(name__startswith="p2").exists()
    resp = patch(admin_client, f"{CORE}/pods/nope", {"metadata": {"labels": {"a": "b"}}})
    assert resp.status_code == 404


def podgroup(name: str, min_member: int) -> dict:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": min_member, "scheduleTimeoutSeconds": 600}}


def group_pod(name: str, group: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"scheduling.x-k8s.io/pod-group": group}},
            "spec": pod_spec("h100x8")}


@pytest.mark.parametrize("nodes, placed", [(8, True), (7, False)])
def test_a_pod_group_of_eight_is_placed_all_or_nothing(admin_client, db, nodes, placed):
    fleet.load({"c1": fleet.nodes("c1", {"zone-a": {"rack-a1": {"block-1": nodes}}})})
    template_services.create_template(NS, fleet.template_body("h100x8", 8))
    assert post(admin_client, f"{PG}/podgroups", podgroup("train", 8)).status_code == 201
    for i in range(7):
        assert post(admin_client, f"{CORE}/pods", group_pod(f"w-{i}", "train")).status_code == 201
    # Seven of eight: nothing is asked for yet, the pods wait for their group.
    assert not ResourceClaim.objects.exists() and not Gang.objects.exists()
    group = admin_client.get(f"{PG}/podgroups/train").json()
    assert group["status"]["phase"] == "Pending" and "7/8" in group["status"]["message"]
    assert admin_client.get(f"{CORE}/pods/w-0").json()["status"]["reason"] == "WaitingForPodGroup"
    assert post(admin_client, f"{CORE}/pods", group_pod("w-7", "train")).status_code == 201

    claims = list(ResourceClaim.objects.order_by("name"))
    assert len(claims) == 8 and all(re.fullmatch(r"w-\d-gpu-[a-z0-9]{5}", c.name) for c in claims)
    group = admin_client.get(f"{PG}/podgroups/train").json()
    ready = [admin_client.get(f"{CORE}/pods/w-{i}").json()["status"]["conditions"][0]["status"] for i in range(8)]
    if placed:
        assert {c.phase for c in claims} == {Phase.ALLOCATED}
        assert group["status"]["phase"] == "Scheduled" and group["status"]["scheduled"] == 8
        assert ready == ["True"] * 8
    else:  # seven would fit: none is placed, nothing is held
        assert {c.phase for c in claims} == {Phase.PENDING} and DeviceAllocation.objects.count() == 0
        assert group["status"]["phase"] == "Scheduling" and group["status"]["scheduled"] == 0
        assert ready == ["False"] * 8
    assert admin_client.delete(f"{PG}/podgroups/train").status_code == 200
    assert not ResourceClaim.objects.exists() and not Gang.objects.exists()
    assert admin_client.get(f"{CORE}/pods/w-0").json()["status"]["reason"] == "WaitingForPodGroup"


def test_a_pod_group_with_kai_placement_annotations_lands_in_one_rack(admin_client, gpus):
    group = podgroup("racked", 4)
    group["metadata"]["annotations"] = {"kai.scheduler/topology-required-placement": "not a label key!"}
    resp = post(admin_client, f"{PG}/podgroups", group)
    assert resp.status_code == 422 and "kai.scheduler/topology-required-placement" in resp.json()["message"]
    group["metadata"]["annotations"] = {"kai.scheduler/topology-required-placement": fleet.RACK,
                                        "kai.scheduler/topology-preferred-placement": fleet.BLOCK}
    assert post(admin_client, f"{PG}/podgroups", group).status_code == 201
    for i in range(4):
        assert post(admin_client, f"{CORE}/pods", group_pod(f"r-{i}", "racked")).status_code == 201
    gang = Gang.objects.get()
    assert gang.spec["topology"] == {"levels": [fleet.RACK, fleet.BLOCK], "required": fleet.RACK,
                                     "preferred": fleet.BLOCK}
    assert gang.phase == "Placed" and gang.domain == {fleet.RACK: "rack-a1"}  # the only rack with 4 nodes
    nodes = {admin_client.get(f"{CORE}/pods/r-{i}").json()["spec"]["nodeName"] for i in range(4)}
    assert len(nodes) == 4 and all("block-1" in n or "block-2" in n for n in nodes)


def test_a_pod_group_of_pods_with_extended_resources_is_a_gang(admin_client, gpus):
    assert post(admin_client, f"{PG}/podgroups", podgroup("pair", 2)).status_code == 201
    for i in range(2):
        body = group_pod(f"x-{i}", "pair")
        body["spec"] = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}
        assert post(admin_client, f"{CORE}/pods", body).status_code == 201
    claims = claims_of("x-")
    assert [c.name[:-6] for c in claims] == ["x-0-extended-resources", "x-1-extended-resources"]
    assert {c.phase for c in claims} == {Phase.ALLOCATED} and Gang.objects.get().placed_count == 2
    # A gang's members are fixed: a third pod waits, and says why.
    body["metadata"]["name"] = "x-2"
    assert post(admin_client, f"{CORE}/pods", body).json()["status"]["reason"] == "PodGroupFormed"


def test_a_pod_group_that_cannot_be_a_gang_says_which_pod_field_is_wrong(admin_client, gpus):
    queue_services.create_queue({"metadata": {"name": "small"}, "spec": {"namespaces": [NS]}})
    assert post(admin_client, f"{PG}/podgroups", podgroup("pg", 2)).status_code == 201
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "labels": {
        "kueue.x-k8s.io/queue-name": "small"}}, "spec": {"parallelism": 2, "template": {
            "metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "pg"}},
            "spec": pod_spec(priorityClassName="train")}}}
    resp = post(admin_client, f"{BATCH}/jobs", job)  # train is 50: over the queue's maxPriority 0
    assert resp.status_code == 422, resp.content
    assert resp.json()["details"]["causes"][0]["field"] == "spec.template.metadata.labels[draservice.io/priority]"
    assert not Gang.objects.exists() and not ResourceClaim.objects.exists()


def test_extended_resources_are_served_by_the_class_that_names_them(admin_client, gpus):
    def pod(limits: dict) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda"},
                "spec": {"containers": [{"name": "main", "image": "cuda:12",
                                         "resources": {"limits": {**limits, "cpu": "4", "memory": "1Gi"}}}]}}

    resp = post(admin_client, f"{CORE}/pods", pod({"example.com/fpga": 1}))
    assert resp.status_code == 422, resp.content
    assert "no DeviceClass serves this extended resource" in resp.json()["message"]
    assert "example.com/fpga" in resp.json()["message"]
    # The demo fleet's gpu.nvidia.com class says spec.extendedResourceName: nvidia.com/gpu.
    resp = post(admin_client, f"{CORE}/pods", pod({"nvidia.com/gpu": 2}))
    assert resp.status_code == 201, resp.content
    status = resp.json()["status"]["extendedResourceClaimStatus"]
    assert re.fullmatch(r"cuda-extended-resources-[a-z0-9]{5}", status["resourceClaimName"])
    assert status["requestMappings"] == [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                                          "requestName": "container-0-request-0"}]
    claim = ResourceClaim.objects.get(name=status["resourceClaimName"])
    assert claim.spec["devices"]["requests"][0]["name"] == "container-0-request-0"
    assert claim.spec["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert claim.spec["devices"]["requests"][0]["exactly"]["count"] == 2
    assert claim.phase == Phase.ALLOCATED and len(claim.allocation["devices"]["results"]) == 2
    assert admin_client.delete(f"{CORE}/pods/cuda").status_code == 200
    assert not ResourceClaim.objects.filter(pk=claim.pk).exists()
    # Any class by its name, as upstream allows.
    resp = post(admin_client, f"{CORE}/pods", pod({"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}))
    assert resp.status_code == 201 and resp.json()["status"]["conditions"][0]["status"] == "True"


def test_queue_labels_and_priority_classes_go_onto_the_pods_claims(admin_client, gpus):
    queue_services.create_queue({"metadata": {"name": "research"}, "spec": {"namespaces": [NS],
                                                                           "maxPriority": 100}})
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "kueue-job", "labels": {"kueue.x-k8s.io/queue-name": "research"}},
           "spec": {"template": {"spec": pod_spec(priorityClassName="inference")}}}
    resp = post(admin_client, f"{BATCH}/jobs", job)  # inference is 125: over the queue's cap
    assert resp.status_code == 422 and "spec.template.metadata.labels[draservice.io/priority]" in resp.json()[
        "message"], resp.content
    job["spec"]["template"]["spec"]["priorityClassName"] = "build"
    resp = post(admin_client, f"{BATCH}/jobs", job)
    assert resp.status_code == 201, resp.content
    (claim,) = claims_of("kueue-job-")
    assert claim.labels["kueue.x-k8s.io/queue-name"] == "research" and claim.labels["draservice.io/priority"] == \
        "100"
    rendered = admin_client.get(f"/k8s/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim.name}").json()
    assert rendered["status"]["queue"] == "research"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kai", "labels": {"kai.scheduler/queue": "other"}},
           "spec": pod_spec(priorityClassName="no-such-class")}
    resp = post(admin_client, f"{CORE}/pods", pod)
    assert resp.status_code == 422 and "no PriorityClass with name no-such-class" in resp.json()["message"]
    pod["spec"] = pod_spec()
    queue_services.create_queue({"metadata": {"name": "other"}, "spec": {"namespaces": ["elsewhere"]}})
    resp = post(admin_client, f"{CORE}/pods", pod)  # a queue the namespace may not use: refused, nothing made
    assert resp.status_code == 422 and not ResourceClaim.objects.filter(name__startswith="kai-").exists(), \
        resp.content


def test_namespace_tokens_see_and_write_only_their_workloads(ns_client, admin_client, gpus):
    mine = ns_client(NS)
    assert post(mine, f"{APPS}/deployments", deployment("own", 1)).status_code == 201
    other = ns_client("elsewhere")
    assert other.get(f"{APPS}/deployments/own").status_code == 403
    assert [d["metadata"]["name"] for d in other.get("/k8s/apis/apps/v1/deployments").json()["items"]] == []
    assert len(mine.get("/k8s/apis/apps/v1/deployments").json()["items"]) == 1


def test_kubectl_scale_reads_and_patches_the_scale_subresource(admin_client, ns_client, gpus):
    post(admin_client, f"{APPS}/statefulsets", deployment("db", 2) | {"kind": "StatefulSet"})
    scale = admin_client.get(f"{APPS}/statefulsets/db/scale").json()
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 2, "selector": "app=db"}
    resp = patch(admin_client, f"{APPS}/statefulsets/db/scale", {"spec": {"replicas": 3}})
    assert resp.status_code == 200 and resp.json()["status"]["replicas"] == 3, resp.content
    assert len(claims_of("db-")) == 3
    put = admin_client.put(f"{APPS}/statefulsets/db/scale", json.dumps({**scale, "spec": {"replicas": 1}}),
                           content_type="application/json")
    assert put.status_code == 409  # the resourceVersion it read is stale
    scale = admin_client.get(f"{APPS}/statefulsets/db/scale").json()
    put = admin_client.put(f"{APPS}/statefulsets/db/scale", json.dumps({**scale, "spec": {"replicas": 1}}),
                           content_type="application/json")
    assert put.status_code == 200 and [c.name.split("-gpu-")[0] for c in claims_of("db-")] == ["db-0"]
    assert admin_client.delete(f"{APPS}/statefulsets/db/scale").status_code == 405
    assert admin_client.get(f"{CORE}/pods/db-0/scale").status_code == 404
    reader = ns_client(NS, read_only=True)
    assert reader.get(f"{APPS}/statefulsets/db/scale").status_code == 200
    assert patch(reader, f"{APPS}/statefulsets/db/scale", {"spec": {"replicas": 3}}).status_code == 403


def test_an_upstream_workload_gang_groups_pods_by_workload_ref_and_replica_key(admin_client, gpus):
    """scheduling.k8s.io/v1alpha1 Workload: each (podGroup, podGroupReplicaKey) of a gang policy is a gang of
    its own once minCount pods reference it; a basic group's pods get their claims one by one."""
    def pod(name: str, group: str, key: str | None = None) -> dict:
        ref = {"name": "job", "podGroup": group, **({"podGroupReplicaKey": key} if key else {})}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": pod_spec("gpu1", workloadRef=ref)}

    for i in range(2):
        assert post(admin_client, f"{CORE}/pods", pod(f"w0-{i}", "workers", "0")).status_code == 201
    assert post(admin_client, f"{CORE}/pods", pod("w1-0", "workers", "1")).status_code == 201
    assert post(admin_client, f"{CORE}/pods", pod("driver", "driver")).status_code == 201
    assert not ResourceClaim.objects.exists()  # no Workload yet: every pod waits
    workload = {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload", "metadata": {"name": "job"},
                "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 2}}},
                                       {"name": "driver", "policy": {"basic": {}}}]}}
    resp = post(admin_client, "/k8s/apis/scheduling.k8s.io/v1alpha1/namespaces/team/workloads", workload)
    assert resp.status_code == 201, resp.content
    groups = {g["name"]: g for g in resp.json()["status"]["podGroups"]}
    assert [g["gang"] for g in groups["workers"]["gangs"]] == ["job-workers-0"]
    assert groups["workers"]["gangs"][0]["phase"] == "Scheduled" and groups["workers"]["waitingPods"] == 1
    assert groups["driver"]["gangs"] == [] and groups["driver"]["waitingPods"] == 0
    assert [c.name[:-6] for c in claims_of("")] == ["driver-gpu", "w0-0-gpu", "w0-1-gpu"]
    assert {c.phase for c in claims_of("")} == {Phase.ALLOCATED}
    # Replica key 1 gets its second pod: a second gang.
    assert post(admin_client, f"{CORE}/pods", pod("w1-1", "workers", "1")).status_code == 201
    assert sorted(Gang.objects.values_list("name", flat=True)) == ["job-workers-0", "job-workers-1"]
    bad = {**workload, "metadata": {"name": "bad"}, "spec": {"podGroups": [{"name": "x", "policy": {}}]}}
    resp = post(admin_client, "/k8s/apis/scheduling.k8s.io/v1alpha1/namespaces/team/workloads", bad)
    assert resp.status_code == 422 and "spec.podGroups[0].policy" in resp.json()["message"]
    assert admin_client.delete("/k8s/apis/scheduling.k8s.io/v1alpha1/namespaces/team/workloads/job").status_code \
        == 200
    assert not ResourceClaim.objects.exists() and not Gang.objects.exists() and not Consumer.objects.exists()
    assert admin_client.get(f"{CORE}/pods/driver").json()["status"]["reason"] == "WaitingForPodGroup"


def test_a_group_defined_while_its_last_pod_arrives_is_formed_once(gpus, monkeypatch):
    """Both transactions insert first, then meet (a barrier) before either looks for the other's rows: the
    per-group lock makes the second one see the first's commit, so the group becomes a gang exactly once."""
    workload_services.create(NS, "Pod", group_pod("a-0", "race"))
    barrier, real, seen = threading.Barrier(2, timeout=20), podgroups._lock_group, threading.local()

    def meet_then_lock(ns, kind, name):
        if not getattr(seen, "met", False):
            seen.met = True
            barrier.wait()
        real(ns, kind, name)

    real_form, after = podgroups.form, threading.Barrier(2, timeout=2)

    def form_then_meet(ns, group):
        # Without the lock both would get here having missed the other's rows; with it the second waits on the
        # lock inside form while the first gives up waiting here and commits.
        formed = real_form(ns, group)
        with contextlib.suppress(threading.BrokenBarrierError):
            after.wait()
        return formed

    monkeypatch.setattr(podgroups, "_lock_group", meet_then_lock)
    monkeypatch.setattr(podgroups, "form", form_then_meet)
    errors: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(lambda: workload_services.create(NS, "PodGroup",
                                                                                podgroup("race", 2)),)),
               threading.Thread(target=run, args=(lambda: workload_services.create(NS, "Pod",
                                                                                group_pod("a-1", "race")),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert list(Gang.objects.values_list("name", flat=True)) == ["race"]
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 2


def test_watching_pods_sees_them_added_get_devices_and_go(admin_client, gpus, monkeypatch):
    monkeypatch.setattr(workload_watch, "POLL_SECONDS", 0.05)
    post(admin_client, f"{APPS}/deployments", deployment("w", 2))
    resp = admin_client.get(f"{CORE}/pods?watch=1&timeoutSeconds=60")  # closed below
    assert resp.status_code == 200
    stream = (chunk for chunk in resp.streaming_content if chunk)  # the first is the headers' flush
    first = [json.loads(next(stream)) for _ in range(2)]
    assert {e["type"] for e in first} == {"ADDED"}
    assert all(e["object"]["status"]["reason"] == "Allocated" for e in first)
    patch(admin_client, f"{APPS}/deployments/w", {"spec": {"replicas": 1}})
    gone = json.loads(next(stream))
    assert gone["type"] == "DELETED" and gone["object"]["metadata"]["name"] in {
        e["object"]["metadata"]["name"] for e in first}
    patch(admin_client, f"{APPS}/deployments/w", {"spec": {"replicas": 2}})
    added = json.loads(next(stream))
    assert added["type"] == "ADDED" and added["object"]["kind"] == "Pod"
    post(admin_client, f"{CORE}/pods", group_pod("late", "g1"))
    waiting = json.loads(next(stream))
    assert waiting["type"] == "ADDED" and waiting["object"]["status"]["reason"] == "WaitingForPodGroup"
    post(admin_client, f"{PG}/podgroups", podgroup("g1", 1))
    placed = json.loads(next(stream))
    assert placed["type"] == "MODIFIED" and placed["object"]["status"]["reason"] == "Allocated"
    resp.close()
    table = admin_client.get(f"{APPS}/deployments?watch=1&timeoutSeconds=1",
                             HTTP_ACCEPT="application/json;as=Table;v=v1;g=meta.k8s.io")
    event = json.loads(next(c for c in table.streaming_content if c))
    assert event["object"]["kind"] == "Table" and event["object"]["rows"][0]["cells"][:2] == ["w", "2/2"]
    table.close()
    # From a list's resourceVersion: the current state once (what was listed may have changed since).
    changes.seal()
    changes.seal()  # past seqs of rows earlier tests truncated: a list's resourceVersion is then not "0"
    since = admin_client.get(f"{APPS}/deployments").json()["metadata"]["resourceVersion"]
    again = admin_client.get(f"{APPS}/deployments?watch=1&timeoutSeconds=1&resourceVersion={since}")
    event = json.loads(next(c for c in again.streaming_content if c))
    assert event["type"] == "MODIFIED" and event["object"]["status"]["readyReplicas"] == 2
    again.close()


@pytest.mark.parametrize("url, body", [
    (f"{CORE}/pods", {"metadata": {"name": "x"}, "spec": {}}),
    (f"{CORE}/pods", {"metadata": {"name": "x"}, "spec": {"containers": "no"}}),
    (f"{CORE}/pods", {"metadata": {"name": "x"}}),
    (f"{CORE}/pods", {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "resources": {
        "limits": {"nvidia.com/gpu": "lots"}}}]}}),
    (f"{CORE}/pods", {"metadata": {"name": "x"}, "spec": pod_spec() | {"resourceClaims": "gpu"}}),
    (f"{CORE}/pods", {"metadata": {"name": "x"}, "spec": pod_spec() | {"resourceClaims": [{"name": "a"}]}}),
    (f"{APPS}/deployments", {"metadata": {"name": "x"}, "spec": {"replicas": 1}}),
    (f"{APPS}/deployments", {"metadata": {"name": "x"}, "spec": {"replicas": "two", "template": {"spec": {
        "containers": [{"name": "c"}]}}}}),
    (f"{BATCH}/jobs", {"metadata": {"name": "x"}, "spec": {"parallelism": 10_000, "template": {"spec": pod_spec()}}}),
    (f"{PG}/podgroups", {"metadata": {"name": "x"}, "spec": {"minMember": 0}}),
    (f"{PG}/podgroups", {"metadata": {"name": "x"}, "spec": {"minMember": 2, "scheduleTimeoutSeconds": -1}}),
    ("/k8s/apis/scheduling.k8s.io/v1alpha1/namespaces/team/workloads", {"metadata": {"name": "x"}, "spec": {}}),
])
def test_invalid_workloads_are_422_and_leave_nothing(admin_client, gpus, url, body):
    resp = post(admin_client, url, body)
    assert resp.status_code == 422, resp.content
    assert resp.json()["kind"] == "Status" and resp.json()["reason"] == "Invalid"
    assert not Consumer.objects.exists() and not ResourceClaim.objects.exists()
    assert admin_client.get(f"{CORE}/pods").json()["items"] == []


def test_conflicts_and_missing_objects_answer_as_kubernetes_does(admin_client, gpus):
    assert post(admin_client, f"{APPS}/deployments", deployment("d", 1)).status_code == 201
    again = post(admin_client, f"{APPS}/deployments", deployment("d", 1))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"
    current = admin_client.get(f"{APPS}/deployments/d").json()
    stale = {**current, "metadata": {**current["metadata"], "resourceVersion": "999"}}
    resp = admin_client.put(f"{APPS}/deployments/d", json.dumps(stale), content_type="application/json")
    assert resp.status_code == 409 and resp.json()["reason"] == "Conflict"
    current["spec"]["replicas"] = 2
    resp = admin_client.put(f"{APPS}/deployments/d", json.dumps(current), content_type="application/json")
    assert resp.status_code == 200 and resp.json()["status"]["replicas"] == 2
    assert admin_client.delete(f"{APPS}/deployments/nope").status_code == 404
    assert admin_client.get(f"{BATCH}/jobs/nope").json()["message"] == 'jobs.batch "nope" not found'


def test_label_selectors_pick_pods(admin_client, gpus):
    post(admin_client, f"{APPS}/deployments", deployment("sel", 2))
    post(admin_client, f"{CORE}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "labels": {
        "app": "x"}}, "spec": pod_spec()})

    def names(selector: str) -> list[str]:
        items = admin_client.get(f"{CORE}/pods", {"labelSelector": selector}).json()["items"]
        return sorted(p["metadata"]["name"].split("-")[0] for p in items)

    assert names("app=sel") == ["sel", "sel"] and names("app!=sel") == ["other"]
    assert names("app in (sel,x)") == ["other", "sel", "sel"] and names("app notin (x)") == ["sel", "sel"]
    assert names("pod-template-hash") == ["sel", "sel"] and names("!pod-template-hash") == ["other"]
