"""The periodic tasks of the queues app (collected by ``draservice.beat``). The preemption pass
(``queues-preempt``) is the scheduler's: ``scheduler.schedule``."""

SCHEDULE: dict = {}
