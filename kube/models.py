"""Objects that exist only at the Kubernetes front door."""
import uuid

from django.db import models


class ResourcePoolStatusRequest(models.Model):
    """resource.k8s.io/v1alpha3 ResourcePoolStatusRequest (upstream 1.36 alpha): a question about pool
    availability, answered once at creation and immutable afterwards. Kept ``POOL_STATUS_RETENTION``."""

    name = models.CharField(max_length=253, unique=True)
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    labels = models.JSONField(default=dict, blank=True)
    spec = models.JSONField()
    status = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Who asked, for the caps (claims.services.caps): "ns:<namespace>" for a namespace token, "cluster:<name>"
    # for a cluster token, "" for an admin. Not rendered.
    owner = models.CharField(max_length=80, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["owner", "created_at"], name="kube_rpsr_owner")]


class ManagedFields(models.Model):
    """``metadata.managedFields`` of an object the door serves (server-side apply, ``kube.apply``): kept beside
    the owning apps' rows rather than in each of them. ``uid`` is the object's: entries of a deleted object
    never pass to a new one of the same name."""

    resource = models.CharField(max_length=63)  # the plural: resourceclaims, queues, deployments...
    namespace = models.CharField(max_length=253, blank=True, default="")
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=80)
    entries = models.JSONField(default=list)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["resource", "namespace", "name"], name="kube_managed_one")]
