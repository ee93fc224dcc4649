"""Workloads as users write them: Pods, Deployments, StatefulSets, Jobs and PodGroups, stored as given.

We allocate; we do not run pods. A pod (written by the user, or one replica of a workload, stored as a Pod
row with ``owner`` set) becomes one Consumer of the claims app; a PodGroup becomes one Gang. The rows here
hold the user's objects and the links; claims and consumers are written only by the claims app's services.
"""
from __future__ import annotations

import uuid

from django.db import models


class Kind(models.TextChoices):
    POD = "Pod"
    DEPLOYMENT = "Deployment"
    STATEFULSET = "StatefulSet"
    JOB = "Job"
    PODGROUP = "PodGroup"
    WORKLOAD = "Workload"  # scheduling.k8s.io/v1alpha1: pod groups with a basic or gang policy


class Gate(models.TextChoices):
    """Why a pod has no consumer yet although it wants devices."""

    NONE = "", "none"
    POD_GROUP = "PodGroup"  # waits for its PodGroup to have minMember pods (then they become one gang)
    FORMED = "PodGroupFormed"  # came after its group became a gang: a gang's members are fixed


class Workload(models.Model):
    namespace = models.ForeignKey("claims.Namespace", on_delete=models.PROTECT, related_name="workloads")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=253)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    resource_version = models.BigIntegerField(default=1)
    generation = models.BigIntegerField(default=1)
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    spec = models.JSONField(default=dict)
    # A replica's workload. PROTECT: the service deletes the pods (and their consumers) first.
    owner = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="pods")
    ordinal = models.IntegerField(null=True, blank=True)  # a StatefulSet pod's ordinal, an Indexed Job's index
    template_hash = models.CharField(max_length=16, blank=True, default="")  # the pod template it was made from
    # Number of claims a pod wants (entries + one for extended resources): 0 means it needs no devices.
    wanted_claims = models.IntegerField(default=0)
    # The group a pod belongs to (workloads.spec.PodTemplate.group): "PodGroup/<name>" or
    # "Workload/<name>/<podGroup>[/<replica key>]"; empty when none.
    group = models.CharField(max_length=600, blank=True, default="")
    gate = models.CharField(max_length=16, choices=Gate.choices, blank=True, default=Gate.NONE)
    consumer = models.OneToOneField("claims.Consumer", on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="workload")
    gang = models.OneToOneField("gangs.Gang", on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="pod_group")  # a PodGroup's, once formed
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["namespace", "kind", "name"],
                                               name="workloads_workload_unique_name")]
        indexes = [models.Index(fields=["namespace", "kind"], name="workloads_ns_kind"),
                   models.Index(fields=["namespace", "group"], name="workloads_ns_group")]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace_id}/{self.name}"
