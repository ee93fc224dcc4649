from django.apps import AppConfig


class KubeConfig(AppConfig):
    """The Kubernetes front door: the service's objects under ``/k8s`` as a Kubernetes API server shows them,
    for kubectl, client-go and the Python ``kubernetes`` client."""

    name = "kube"

    def ready(self):
        # Here rather than in kube.stores: the workload stores build on kube.stores.Store (no import cycle).
        from claims.services import caps
        from draservice import dryrun
        from inventory.services.doctor import forget_vocabulary
        from kube.poolstatus import count_of_namespace
        from kube.stores import STORES
        from kube.taint_rules import DeviceTaintRuleStore
        from kube.verdict import claim_verdict
        from kube.workload_stores import WORKLOAD_STORES
        from kube.workload_watch import DiffWatch

        STORES.update(WORKLOAD_STORES)
        STORES["devicetaintrules"] = DeviceTaintRuleStore()
        STORES["deviceclasses"].watch_class = DiffWatch  # type: ignore[attr-defined]  # kube.taint_rules says why
        dryrun.register_verdict("ResourceClaim", claim_verdict)  # at both doors: /api/v1 and /k8s
        dryrun.register_reset(forget_vocabulary)  # the doctor may have read a class the dry run never kept
        caps.register_use_count(caps.POOL_STATUS_REQUESTS, count_of_namespace)  # the ObjectQuota's "used"
