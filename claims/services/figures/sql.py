"""Table names for the fleet figures' hand-written SQL, and the dialect helpers of ``inventory.sql``.

The fleet aggregates are written as SQL because they join devices to allocations on the composite key
(cluster, driver, pool, device), which has no foreign key the ORM could follow, and a LEFT JOIN + GROUP BY is
one pass where ORM ``Exists`` annotations would probe an index once per device. Only constant paths chosen by
this module are interpolated; every value is a query parameter.
"""
from __future__ import annotations

from claims.models import DeviceAllocation, Namespace, Reservation, ResourceClaim
from inventory.models import Cluster, Device, DeviceTaintRule, Node, Pool, ResourceSlice
from inventory.sql import (  # noqa: F401  re-exported for the figures' and the dashboard's queries
    fetch_dicts,
    fetch_rows,
    is_postgres,
    json_array_nonempty,
    json_text,
    product_expr,
)

T_DEVICE = Device._meta.db_table
T_CLUSTER = Cluster._meta.db_table
T_POOL = Pool._meta.db_table
T_NODE = Node._meta.db_table
T_SLICE = ResourceSlice._meta.db_table
T_TAINTRULE = DeviceTaintRule._meta.db_table
T_ALLOC = DeviceAllocation._meta.db_table
T_RESERVATION = Reservation._meta.db_table
T_CLAIM = ResourceClaim._meta.db_table
T_NAMESPACE = Namespace._meta.db_table
