"""``kubectl get`` columns of the workload kinds, as the API server prints them where it can (Deployment
READY "2/3"), with what is true here: READY counts pods whose devices are all allocated, and a pod's STATUS
says whether it has its devices (it never runs: we allocate, we do not run pods)."""
from __future__ import annotations


def _col(name: str, description: str, priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": "string", "format": fmt, "description": description, "priority": priority}


NAME = _col("Name", "The object's name", fmt="name")
AGE = _col("Age", "Time since creation")
READY = _col("Ready", "Pods whose devices are all allocated / pods wanted")

COLUMNS = {
    "pods": [NAME, _col("Ready", "Claims allocated / claims wanted"),
             _col("Status", "Allocated, WaitingForDevices, WaitingForPodGroup... (phase stays Pending)"),
             _col("Node", "The node its devices are on"), AGE],
    "deployments": [NAME, READY, _col("Up-to-date", "Pods of the current template"),
                    _col("Available", "Pods whose devices are all allocated"), AGE],
    "statefulsets": [NAME, READY, AGE],
    "jobs": [NAME, _col("Status", "Running, Suspended"), _col("Active", "Pods"), READY, AGE],
    "podgroups": [NAME, _col("Phase", "Pending until minMember pods exist, then the gang's"),
                  _col("MinMember", "Pods placed together or not at all"), _col("Scheduled", "Pods placed"), AGE],
    "workloads": [NAME, _col("Pod groups", "Its pod groups and their policies"),
                  _col("Scheduled", "Pods placed by its gangs"), AGE],
}


def _ratio(done, wanted) -> str:
    return f"{done or 0}/{wanted or 0}"


def cells(plural: str, obj: dict, age: str) -> list:
    meta, status, spec = obj.get("metadata") or {}, obj.get("status") or {}, obj.get("spec") or {}
    name = meta.get("name")
    if plural == "pods":
        statuses = status.get("conditions") or []
        wanted = sum(1 for _ in (spec.get("resourceClaims") or [])) + (
            1 if status.get("extendedResourceClaimStatus") else 0)
        ready = any(c.get("type") == "DevicesAllocated" and c.get("status") == "True" for c in statuses)
        return [name, _ratio(wanted if ready else 0, wanted), status.get("reason") or status.get("phase"),
                spec.get("nodeName") or "<none>", age]
    if plural == "deployments":
        return [name, _ratio(status.get("readyReplicas"), spec.get("replicas", 1)), status.get("updatedReplicas", 0),
                status.get("availableReplicas", 0), age]
    if plural == "statefulsets":
        return [name, _ratio(status.get("readyReplicas"), spec.get("replicas", 1)), age]
    if plural == "jobs":
        return [name, "Suspended" if spec.get("suspend") else "Running", status.get("active", 0),
                _ratio(status.get("ready"), status.get("active")), age]
    if plural == "podgroups":
        return [name, status.get("phase") or "Pending", spec.get("minMember", 1), status.get("scheduled", 0), age]
    if plural == "workloads":
        groups = status.get("podGroups") or []
        return [name, ",".join(f"{g['name']}({g['policy']})" for g in groups),
                sum(x.get("scheduled", 0) for g in groups for x in g.get("gangs") or []), age]
    return [name, age]
