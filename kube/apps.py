from django.apps import AppConfig


class KubeConfig(AppConfig):
    """The Kubernetes front door: the service's objects under ``/k8s`` as a Kubernetes API server shows them,
    for kubectl, client-go and the Python ``kubernetes`` client."""

    name = "kube"
