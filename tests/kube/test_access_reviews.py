"""kubectl auth can-i against the door (SelfSubjectAccessReview, SelfSubjectRulesReview; kubectl sends them as
protobuf): the answers follow the rules the door enforces for each token."""
from __future__ import annotations


def test_can_i_answers_for_a_namespace_token_and_an_admin(kubectl):
    def can(*args: str, as_team: bool = True) -> str:
        return kubectl("auth", "can-i", *args, as_team=as_team, check=False).stdout.split(" ")[0].strip()

    assert can("create", "resourceclaims") == "yes"  # its kubeconfig's namespace, team-a
    assert can("create", "resourceclaims", "-n", "team-a") == "yes"
    assert can("create", "resourceclaims", "-n", "team-b") == "no"
    assert can("get", "resourceclaims", "-n", "team-b") == "no"
    assert can("create", "queues.draservice.io") == "no"
    assert can("list", "deviceclasses") == "yes"
    assert can("create", "queues.draservice.io", as_team=False) == "yes"
    assert can("create", "resourceclaims", "-n", "team-b", as_team=False) == "yes"
    denied = kubectl("auth", "can-i", "create", "resourceclaims", "-n", "team-b", as_team=True, check=False)
    assert denied.returncode == 1 and 'this token may not write namespace "team-b"' in denied.stdout
    rules = kubectl("auth", "can-i", "--list", "-n", "team-a", as_team=True).stdout
    claims = next(line for line in rules.splitlines() if line.startswith("resourceclaims.resource.k8s.io "))
    assert "[create delete deletecollection get list patch update watch]" in claims
    queues = next(line for line in rules.splitlines() if line.startswith("queues.draservice.io "))
    assert "[get list]" in queues


def test_each_token_kind_is_answered_by_the_rules_the_door_enforces():
    from draservice.models import APIToken
    from draservice.permissions import NO_ACCESS, Access
    from kube.authorization import access_review, rules_review

    def allowed(access, verb, resource, namespace="", group="resource.k8s.io") -> bool:
        spec = {"resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace}}
        return access_review(access, spec)["allowed"]

    admin = Access(kind=APIToken.ADMIN, read_only=False)
    reader = Access(kind=APIToken.ADMIN, read_only=True)
    team = Access(kind=APIToken.NAMESPACE, read_only=False, namespaces=frozenset({"team-a"}))
    team_reader = Access(kind=APIToken.NAMESPACE, read_only=True, namespaces=frozenset({"team-a"}))
    agent = Access(kind=APIToken.CLUSTER, read_only=False, cluster_name="east")
    table = {(a, v, r, ns): allowed(a, v, r, ns) for a in (admin, reader, team, team_reader, agent, NO_ACCESS)
             for v, r, ns in (("create", "resourceclaims", "team-a"), ("create", "resourceclaims", "team-b"),
                              ("list", "resourceclaims", "team-b"), ("create", "deviceclasses", ""),
                              ("create", "resourcetemplates", "team-a"),
                              ("create", "resourcepoolstatusrequests", ""), ("update", "resourceslices", ""))}
    assert [table[(a, "create", "resourceclaims", "team-a")] for a in (admin, reader, team, team_reader, agent,
                                                                        NO_ACCESS)] == [
        True, False, True, False, True, False]
    assert [table[(a, "create", "resourceclaims", "team-b")] for a in (admin, team, agent)] == [True, False, True]
    assert [table[(a, "list", "resourceclaims", "team-b")] for a in (reader, team, team_reader, agent)] == [
        True, False, False, True]
    assert [table[(a, "create", "deviceclasses", "")] for a in (admin, reader, team, agent)] == [
        True, False, False, False]
    assert not any(table[(a, "create", "resourcetemplates", "team-a")] for a in (admin, team))  # no such kind
    assert [table[(a, "create", "resourcepoolstatusrequests", "")] for a in (reader, team_reader, NO_ACCESS)] == [
        True, True, False]
    assert not any(table[(a, "update", "resourceslices", "")] for a in (admin, agent))  # read-only at the door
    agent_claims = access_review(agent, {"resourceAttributes": {"verb": "create", "group": "resource.k8s.io",
                                                                "resource": "resourceclaims", "namespace": "x"}})
    assert agent_claims == {"allowed": True, "reason": 'only claims pinned to or allocated in cluster "east"'}
    rules = rules_review(team_reader, "team-a")["resourceRules"]
    assert {"verbs": ["get", "list", "watch"], "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses", "devicetaintrules", "resourceclaims", "resourceclaimtemplates"]} in rules
    assert not any("create" in rule["verbs"] and rule["apiGroups"] != ["resource.k8s.io"] for rule in rules)
