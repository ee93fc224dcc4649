"""Read-side queries for the dashboard. Aggregation happens in the database (GROUP BY over devices and
allocations); views only ever get small, already-summarised rows, so pages stay fast on a 40,000-device fleet.
"""
