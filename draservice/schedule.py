"""The platform's periodic work: the change log's watermark and retention."""
from datetime import timedelta

SCHEDULE = {
    "draservice-seal-changes": {"task": "draservice.tasks.seal_changes", "schedule": timedelta(seconds=5)},
    "draservice-compact-changes": {"task": "draservice.tasks.compact_changes", "schedule": timedelta(minutes=1)},
}
