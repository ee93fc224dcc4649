"""draservice-agent: runs in a Kubernetes cluster, pushes its DRA inventory to draservice and writes the
service's allocations back to the cluster's ResourceClaims. Entry point: ``python -m agent``."""
from importlib import metadata

try:
    __version__ = metadata.version("draservice")
except metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"
