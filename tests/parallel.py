"""The suite's xdist scheduling (``make test`` runs ``pytest -n N --dist loadfile``): see
tests/conftest.py ``pytest_xdist_make_scheduler``. Imported only when xdist runs the suite."""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling


class ServiceScheduling(LoadFileScheduling):
    """loadfile, except that the files of one ``shared`` entry (a fixture's name: the files that use it) are
    one unit, and units go out in collection order (the suite puts its slow files first) instead of
    largest-count first."""

    def __init__(self, config, log, shared: dict[str, tuple[str, ...]]) -> None:
        super().__init__(config, log)
        self.shared = shared
        # xdist's default sorts units by their number of tests: a file of 500 vectors taking a second would
        # go before a file of 3 tests taking a minute.
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        for fixture, files in self.shared.items():
            if nodeid.startswith(files):
                return fixture
        return super()._split_scope(nodeid)
