"""The periodic tasks of the gangs app (collected by ``draservice.beat``)."""
from datetime import timedelta

# Beat: the sweep enforces timeouts and minMember; the retry is the safety net that notices devices freed
# by the claims app (it has no hook to tell us, but it bumps FleetState.version, which makes the pending
# gangs eligible again: a pass costs one query when nothing changed).
SCHEDULE = {
    "gangs-sweep": {"task": "gangs.tasks.sweep_gangs", "schedule": timedelta(seconds=5)},
    "gangs-retry-pending": {"task": "gangs.tasks.place_gangs", "schedule": timedelta(seconds=5)},
}
