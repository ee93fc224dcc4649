from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    """The allocation cycle, above claims, queues and gangs: take, order, decide (``dra``), admit, preempt, and
    commit through the claims app's commit service. Its one model is the plan (``PlannedStart``)."""

    name = "scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # The tasks register under their historical names (claims.tasks.*, gangs.tasks.*, queues.tasks.*);
        # imported here so that a worker or the in-process runner knows them whichever module asks first.
        from claims.services import preemption, queueing, walltime
        from queues.services import estimate
        from scheduler import tasks  # noqa: F401
        from scheduler.services import plan, recheck, simulate
        from scheduler.services import preemption as scheduler_preemption

        estimate.register_plan(plan.planned_starts)  # a planned claim's estimate is its planned start
        # Before a confirmed victim's devices move, its preemptor's need is checked again (claims cannot import
        # the scheduler).
        preemption.register_recheck(recheck.still_needed)
        # Simulate against the stored fleet answers what the cycle would do: quota, position, preemptions.
        queueing.register_simulation(simulate.with_queues)
        # A claim whose walltime ended keeps its devices for its queue's forceAfterSeconds, unconfirmed.
        walltime.register_force_after(scheduler_preemption.force_after)
