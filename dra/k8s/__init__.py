"""Kubernetes object shapes (resource.k8s.io/v1): conversion and validation, no Django."""
