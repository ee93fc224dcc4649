"""The door's periodic work: answered ResourcePoolStatusRequests are kept a day."""
from datetime import timedelta

SCHEDULE = {"kube-purge-pool-status-requests": {"task": "kube.tasks.purge_pool_status_requests",
                                                 "schedule": timedelta(hours=1)}}
