"""When persistent database connections are closed: at a random point of the last half of ``CONN_MAX_AGE``.

Django closes a connection at the end of the first request (or task) past ``CONN_MAX_AGE`` since it opened.
Connections opened together - every thread of every web worker at start, or at the first burst of traffic - all
expired in the same second, once a period: the server then started dozens of backends at once, each loading its
catalog caches and parsing and planning the service's statements anew (they are prepared per connection), and
every request and allocation round of that second waited behind them. Drawn per connection, the expiries spread
over half a period after the first one and stay spread.
"""
from __future__ import annotations

import random
import time

from django.db.backends.base.base import BaseDatabaseWrapper

SHORTEST = 0.5  # of CONN_MAX_AGE


def spread_close(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    """``connection_created`` receiver: replace Django's ``close_at`` (open + CONN_MAX_AGE) with a random one."""
    max_age = connection.settings_dict.get("CONN_MAX_AGE")
    if connection.close_at is None or not max_age:
        return  # unlimited, or closed after every request
    connection.close_at = time.monotonic() + max_age * random.uniform(SHORTEST, 1.0)
