"""Test-only seams for the queue race tests: fault injection lives here, not in product code."""
from __future__ import annotations

import functools
import time


def delay_admission_writes(seconds: float) -> None:
    """Sleep ``seconds`` in ``queues.services.admission.admit`` after every unit was checked against its quota
    and before its charges are written, so that concurrent commits overlap in the window the locks guard.
    Rebinds the module's ``bulk_insert`` (the write that follows the checks) for the whole process: call it
    only in a process of its own (the race tests' Celery workers, tests/claims/celery_test_app.py)."""
    from queues.services import admission

    write = admission.bulk_insert

    @functools.wraps(write)
    def delayed(*args, **kwargs):
        time.sleep(seconds)
        return write(*args, **kwargs)

    admission.bulk_insert = delayed
