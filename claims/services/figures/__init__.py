"""The fleet's figures: its accelerators in four states (``accelerators``), per cluster, node, product and
driver, and its claims per phase. One definition, asked by every door that shows them: the dashboard, its
``/metrics`` gauges and ``/api/v1/devices/summary/``. Here, in the claims app, because they join the inventory
to the claims' allocations and reservations."""
