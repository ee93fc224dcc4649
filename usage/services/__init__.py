"""The usage ledger's services: ``ledger`` (written inside the claims commit and release transactions),
``reports`` (device-hours and cost), ``prices`` (the price table)."""
