"""The Gang object as the API takes it (``draservice.io/v1alpha1``, kind ``Gang``), parsed and validated.

::

    apiVersion: draservice.io/v1alpha1
    kind: Gang
    metadata: {name: train-1}
    spec:
      minMember: 8                      # default: every member
      scheduleTimeoutSeconds: 600       # optional: fail (and free everything) if not placed by then
      topology:                         # optional; node-label levels, widest first (KAI / Kueue shape)
        levels: [topology.kubernetes.io/zone, topology.draservice.io/rack, topology.draservice.io/block]
        required: topology.draservice.io/rack     # every member in one rack
        preferred: topology.draservice.io/block   # ideally in one block
      placement: {clusterSelector: {region: eu}, preferredCluster: onprem-fra1}   # optional
      members:                          # each member is a Consumer (a pod): Pod.spec.resourceClaims entries
      - name: worker-0
        resourceClaims: [{name: gpus, resourceClaimTemplateName: h100x8}]
      # ...or, instead of members, N identical ones named member-0..member-N-1:
      replicas: 8
      template: {resourceClaims: [{name: gpus, resourceClaimTemplateName: h100x8}]}

The per-entry checks of ``resourceClaims`` (names, exactly one of claim or template) are the claims app's,
applied when the members' consumers are created.
"""
from __future__ import annotations

from typing import Any

from claims import k8s
from dra.gang import Topology
from dra.k8s.fields import is_dns_label
from draservice.errors import Invalid

KIND = "Gang"
API_VERSION = "draservice.io/v1alpha1"
MAX_MEMBERS = 512  # KAI's published 512-pod job; each member is a consumer with up to 32 claims
MAX_TIMEOUT = 7 * 24 * 3600
_SPEC_FIELDS = {"minMember", "scheduleTimeoutSeconds", "topology", "placement", "members", "replicas", "template"}


def parse_gang(obj: Any, namespace: str) -> tuple[dict, dict]:
    """(metadata, normalized spec) from a request body; raises ``Invalid`` listing every problem."""
    if not isinstance(obj, dict):
        raise Invalid([("", f"must be a {KIND} object")])
    errors: list[tuple[str, str]] = []
    if obj.get("kind") not in (None, "", KIND) or obj.get("apiVersion") not in (None, "", API_VERSION):
        errors.append(("kind", f"must be {KIND} ({API_VERSION})"))
    meta = k8s.parse_metadata(obj, namespace=namespace)
    errors += k8s.check_dns_label(meta["name"], "metadata.name")  # member consumers are named <gang>-<member>
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid(errors + [("spec", "Required value: must be an object")])
    errors += [(f"spec.{k}", "Forbidden: unknown field") for k in sorted(set(spec) - _SPEC_FIELDS)]
    members = _members(spec, errors)
    n = len(members)
    min_member = spec.get("minMember", n)
    if not _is_int(min_member) or not 1 <= min_member <= max(n, 1):
        errors.append(("spec.minMember", f"Invalid value: {min_member!r}: must be between 1 and the number of "
                                          f"members ({n})"))
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and (not _is_int(timeout) or not 1 <= timeout <= MAX_TIMEOUT):
        errors.append(("spec.scheduleTimeoutSeconds", f"Invalid value: {timeout!r}: must be between 1 and "
                                                       f"{MAX_TIMEOUT}"))
    topology = _topology(spec.get("topology"), errors)
    placement = _placement(spec.get("placement"), errors)
    if errors:
        raise Invalid(errors)
    out = {"minMember": min_member, "topology": topology.to_dict(), "members": members}
    if timeout is not None:
        out["scheduleTimeoutSeconds"] = timeout
    if placement:
        out["placement"] = placement
    return meta, out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _members(spec: dict, errors: list) -> list[dict]:
    members = spec.get("members")
    replicas = spec.get("replicas")
    if (members is None) == (replicas is None):
        errors.append(("spec", "must specify exactly one of members or replicas (with template)"))
        return []
    if replicas is not None:
        template = spec.get("template")
        if not _is_int(replicas) or not 1 <= replicas <= MAX_MEMBERS:
            errors.append(("spec.replicas", f"Invalid value: {replicas!r}: must be between 1 and {MAX_MEMBERS}"))
            return []
        if not isinstance(template, dict) or not isinstance(template.get("resourceClaims"), list):
            errors.append(("spec.template.resourceClaims", "Required value: a list of resourceClaims entries"))
            return []
        return [{"name": f"member-{i}", "resourceClaims": template["resourceClaims"]} for i in range(replicas)]
    if spec.get("template") is not None:
        errors.append(("spec.template", "Forbidden: only with replicas"))
    if not isinstance(members, list) or not members:
        errors.append(("spec.members", "Required value: a non-empty list"))
        return []
    if len(members) > MAX_MEMBERS:
        errors.append(("spec.members", f"Too many: {len(members)}: must have at most {MAX_MEMBERS} items"))
        return []
    out: list[dict] = []
    seen: set[str] = set()
    for i, m in enumerate(members):
        path = f"spec.members[{i}]"
        if not isinstance(m, dict):
            errors.append((path, "must be an object"))
            continue
        name = m.get("name")
        errors += k8s.check_listed_name(name, f"{path}.name", seen)
        extra = sorted(set(m) - {"name", "resourceClaims"})
        errors += [(f"{path}.{k}", "Forbidden: unknown field") for k in extra]
        # An empty list is the consumer service's to refuse: a member may have only generated claims (a pod
        # group's pod with extended resources, workloads.services.podgroups).
        if not isinstance(m.get("resourceClaims", []), list):
            errors.append((f"{path}.resourceClaims", "Required value: a list"))
        out.append({"name": name, "resourceClaims": m.get("resourceClaims") or []})
    return out


def _topology(data, errors: list) -> Topology:
    if data is None:
        return Topology()
    if not isinstance(data, dict):
        errors.append(("spec.topology", "must be an object"))
        return Topology()
    errors += [(f"spec.topology.{k}", "Forbidden: unknown field")
               for k in sorted(set(data) - {"levels", "required", "preferred"})]
    levels = data.get("levels") or []
    if not isinstance(levels, list):
        errors.append(("spec.topology.levels", "must be a list of node label keys"))
        return Topology()
    topo = Topology(tuple(levels), data.get("required") or None, data.get("preferred") or None)
    errors += topo.errors("spec.topology")
    return topo


def _placement(data, errors: list) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        errors.append(("spec.placement", "must be an object"))
        return {}
    out = {}
    errors += [(f"spec.placement.{k}", "Forbidden: unknown field")
               for k in sorted(set(data) - {"clusterSelector", "preferredCluster"})]
    selector = data.get("clusterSelector")
    if selector is not None:
        if not isinstance(selector, dict) or not selector or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
            errors.append(("spec.placement.clusterSelector", "must be a non-empty map of cluster label to value "
                                                             "(\"name\" matches the cluster's name)"))
        else:
            out["clusterSelector"] = dict(selector)
    preferred = data.get("preferredCluster")
    if preferred is not None:
        if not is_dns_label(preferred):
            errors.append(("spec.placement.preferredCluster", "must be a cluster name"))
        else:
            out["preferredCluster"] = preferred
    return out
