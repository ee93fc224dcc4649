"""Celery tasks of the Kubernetes front door."""
from celery import shared_task

from kube import poolstatus


@shared_task(name="kube.tasks.purge_pool_status_requests", ignore_result=True)
def purge_pool_status_requests() -> int:
    return poolstatus.purge()
