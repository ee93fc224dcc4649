"""The periodic tasks of the queues app (collected by ``draservice.beat``)."""
from datetime import timedelta

SCHEDULE = {
    "queues-preempt": {"task": "queues.tasks.preempt", "schedule": timedelta(seconds=5)},
}
