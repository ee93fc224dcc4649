"""The periodic tasks of the gangs app (collected by ``draservice.beat``)."""
from datetime import timedelta

# Beat: the sweep enforces timeouts and minMember. (Placing gangs, and its retry, are the scheduler's:
# ``scheduler.schedule``.)
SCHEDULE = {
    "gangs-sweep": {"task": "gangs.tasks.sweep_gangs", "schedule": timedelta(seconds=5)},
}
