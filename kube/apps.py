from django.apps import AppConfig


class KubeConfig(AppConfig):
    """The Kubernetes front door: the service's objects under ``/k8s`` as a Kubernetes API server shows them,
    for kubectl, client-go and the Python ``kubernetes`` client."""

    name = "kube"

    def ready(self):
        # Here rather than in kube.stores: the workload stores build on kube.stores.Store (no import cycle).
        from kube.stores import STORES
        from kube.workload_stores import WORKLOAD_STORES

        STORES.update(WORKLOAD_STORES)
