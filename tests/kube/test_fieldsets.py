"""Server-side apply's field sets and merge (``kube.fieldsets``, ``kube.managed``), pure: the schemas' list types
(atomic, map by keys, set), FieldsV1 as kube-apiserver writes it, conflicts in its words, force, pruning of
what an applier stopped applying, updates taking the fields they change, and an apply that changes nothing
leaving the managers exactly as they were."""
from __future__ import annotations

import pytest

from kube import fieldsets, managed, schemas
from kube.managed import Owner

CLAIM = schemas.definition("ResourceClaim", "resource.k8s.io", "v1")
QUEUE = schemas.definition("Queue", "draservice.io", "v1alpha1")
CONSUMER = schemas.definition("Consumer", "draservice.io", "v1alpha1")
DEPLOYMENT = schemas.definition("Deployment", "apps", "v1")


def claim(count: int = 1, labels: dict | None = None) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "n", "uid": "u1", "resourceVersion": "7",
                         **({"labels": labels} if labels else {})},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}},
            "status": {"phase": "Pending"}}


def consumer(*entries: dict) -> dict:
    return {"metadata": {"name": "w"}, "spec": {"resourceClaims": list(entries)}}


def test_an_atomic_list_is_one_member_and_server_metadata_and_status_are_never_managed():
    paths = fieldsets.field_set(claim(labels={"team": "ml"}), CLAIM)
    assert paths == {("f:metadata", "f:labels", "f:team"), ("f:spec", "f:devices", "f:requests")}
    assert fieldsets.to_fields_v1(paths) == {"f:metadata": {"f:labels": {"f:team": {}}},
                                             "f:spec": {"f:devices": {"f:requests": {}}}}


def test_map_list_items_and_set_values_are_members_with_a_dot_when_they_hold_more():
    paths = fieldsets.field_set(consumer({"name": "a", "resourceClaimName": "x"}), CONSUMER)
    item = ("f:spec", "f:resourceClaims", 'k:{"name":"a"}')
    assert paths == {item, item + ("f:name",), item + ("f:resourceClaimName",)}
    encoded = fieldsets.to_fields_v1(paths)
    assert encoded == {"f:spec": {"f:resourceClaims": {'k:{"name":"a"}': {".": {}, "f:name": {},
                                                                            "f:resourceClaimName": {}}}}}
    assert fieldsets.from_fields_v1(encoded) == paths
    queue = fieldsets.field_set({"spec": {"namespaces": ["a", "b"], "weight": 2}}, QUEUE)
    assert queue == {("f:spec", "f:namespaces", 'v:"a"'), ("f:spec", "f:namespaces", 'v:"b"'),
                     ("f:spec", "f:weight")}


def test_free_form_objects_merge_key_by_key_and_their_lists_are_atomic():
    paths = fieldsets.field_set({"spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "m"}]}}}},
                                DEPLOYMENT)
    assert paths == {("f:spec", "f:replicas"), ("f:spec", "f:template"), ("f:spec", "f:template", "f:spec"),
                     ("f:spec", "f:template", "f:spec", "f:containers")}
    merged = fieldsets.merge({"spec": {"replicas": 1, "paused": False, "list": [1, 2]}},
                             {"spec": {"replicas": 2, "list": [3]}}, DEPLOYMENT)
    assert merged == {"spec": {"replicas": 2, "paused": False, "list": [3]}}


def test_path_strings_are_upstreams():
    assert fieldsets.path_string(("f:spec", "f:resourceClaims", 'k:{"name":"a"}', "f:resourceClaimName")) == \
        '.spec.resourceClaims[name="a"].resourceClaimName'
    assert fieldsets.path_string(("f:spec", "f:namespaces", 'v:"a"')) == '.spec.namespaces[="a"]'


def test_lists_of_type_map_merge_by_key_and_sets_by_value():
    live = consumer({"name": "a", "resourceClaimName": "x"}, {"name": "b", "resourceClaimName": "y"})
    merged = fieldsets.merge(live, consumer({"name": "b", "resourceClaimTemplateName": "t"}, {"name": "c"}),
                             CONSUMER)
    assert merged["spec"]["resourceClaims"] == [{"name": "a", "resourceClaimName": "x"},
                                                {"name": "b", "resourceClaimName": "y",
                                                 "resourceClaimTemplateName": "t"}, {"name": "c"}]
    assert fieldsets.merge({"spec": {"namespaces": ["a"]}}, {"spec": {"namespaces": ["b", "a"]}},
                           QUEUE)["spec"]["namespaces"] == ["a", "b"]


def test_a_conflict_names_the_manager_and_path_as_kube_apiserver_does():
    live, owners = managed.apply({}, claim(labels={"team": "ml"}), [], "kubectl", "resource.k8s.io/v1", False,
                                 CLAIM, "t1")
    labelled = {**live, "metadata": {"labels": {"team": "infra"}}}
    updater = managed.update(live, labelled, owners, "kubectl-label", "resource.k8s.io/v1", CLAIM, "t2")
    assert [(o.manager, o.operation, o.paths) for o in updater] == [
        ("kubectl", "Apply", {("f:spec", "f:devices", "f:requests")}),
        ("kubectl-label", "Update", {("f:metadata", "f:labels", "f:team")})]
    with pytest.raises(managed.ApplyConflict) as one:
        managed.apply(labelled, claim(labels={"team": "ml"}), updater, "kubectl", "resource.k8s.io/v1", False,
                      CLAIM, "t3")
    assert str(one.value) == ('Apply failed with 1 conflict: conflict with "kubectl-label" using resource.k8s.io/v1: '
                              ".metadata.labels.team")
    assert managed.conflict_causes(one.value.conflicts) == [{
        "reason": "FieldManagerConflict", "message": 'conflict with "kubectl-label" using resource.k8s.io/v1',
        "field": ".metadata.labels.team"}]
    with pytest.raises(managed.ApplyConflict) as two:
        managed.apply(live, claim(2, {"team": "x"}), owners, "other", "resource.k8s.io/v1", False, CLAIM, "t3")
    assert str(two.value) == ('Apply failed with 2 conflicts: conflicts with "kubectl"\n- .metadata.labels.team\n'
                              "- .spec.devices.requests")


def test_force_moves_the_fields_and_an_identical_value_is_shared_not_a_conflict():
    live, owners = managed.apply({}, {"spec": {"weight": 2, "priority": 1}}, [], "a", "v", False, QUEUE, "t1")
    merged, after = managed.apply(live, {"spec": {"weight": 3, "priority": 1}}, owners, "b", "v", True, QUEUE, "t2")
    assert merged == {"spec": {"weight": 3, "priority": 1}}
    assert {o.manager: o.paths for o in after} == {"a": {("f:spec", "f:priority")},
                                                   "b": {("f:spec", "f:weight"), ("f:spec", "f:priority")}}


def test_what_an_applier_stops_applying_goes_unless_another_manager_owns_it():
    live, owners = managed.apply({}, {"spec": {"weight": 2, "namespaces": ["a", "b"]}}, [], "a", "v", False,
                                 QUEUE, "t1")
    live, owners = managed.apply(live, {"spec": {"namespaces": ["b"]}}, owners, "b", "v", False, QUEUE, "t2")
    merged, after = managed.apply(live, {"spec": {}}, owners, "a", "v", False, QUEUE, "t3")
    assert merged == {"spec": {"namespaces": ["b"]}}
    assert {o.manager: o.paths for o in after} == {"a": {("f:spec",)}, "b": {("f:spec", "f:namespaces", 'v:"b"')}}


def test_an_apply_that_changes_nothing_keeps_the_managers_and_their_times():
    config = {"metadata": {"labels": {"a": "b"}}, "spec": {"weight": 2}}
    live, owners = managed.apply({}, config, [], "kubectl", "v", False, QUEUE, "t1")
    again, after = managed.apply(live, config, owners, "kubectl", "v", False, QUEUE, "t2")
    assert again == live and managed.encode(after) == managed.encode(owners)
    assert managed.encode(after)[0]["time"] == "t1"


def test_an_update_takes_what_it_changes_and_nobody_keeps_what_it_removed():
    before = {"spec": {"weight": 2, "priority": 1, "parent": "root"}}
    owners = [Owner("a", managed.APPLY, "v", "t1", fieldsets.field_set(before, QUEUE))]
    after = managed.update(before, {"spec": {"weight": 5, "priority": 1}}, owners, "edit", "v", QUEUE, "t2")
    assert {o.manager: o.paths for o in after} == {"a": {("f:spec", "f:priority")}, "edit": {("f:spec", "f:weight")}}
    created = managed.update({}, {"metadata": {"labels": {"x": "y"}}}, [], "kubectl-create", "v", QUEUE, "t3")
    assert managed.encode(created + after)[0]["manager"] == "a"  # Apply entries first, as upstream orders them
    assert managed.encode(created) == [{"manager": "kubectl-create", "operation": "Update", "apiVersion": "v",
                                        "time": "t3", "fieldsType": "FieldsV1",
                                        "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}}}}]
