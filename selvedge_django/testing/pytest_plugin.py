"""The pytest plugin: fixtures ``selvedge_clock`` and ``selvedge_worker``.

Registered through the ``pytest11`` entry point, so pytest loads it in every run
of a virtualenv where selvedge_django is installed, Django project or not. It
therefore imports nothing that needs configured settings: the fixtures import
what they use when a test asks for them, and the teardown hook only touches
the notification listeners when a test has started them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..worker import Worker
    from .clock import ControllableClock

__all__ = ["selvedge_clock", "selvedge_worker"]


@pytest.fixture
def selvedge_clock() -> Iterator[ControllableClock]:
    """A ControllableClock installed as the SELVEDGE CLOCK for the test."""
    from .clock import installed_clock

    with installed_clock() as clock:
        yield clock


@pytest.fixture
def selvedge_worker(transactional_db: None) -> Iterator[Worker]:
    """A started Worker on the test database, stopped after the test."""
    from ..worker import Worker

    worker = Worker()
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=10)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Close LISTEN connections before the test database is dropped."""
    notify: Any = sys.modules.get("selvedge_django.storage.postgresql.listener")
    if nextitem is None and notify is not None:  # never imported: no listener to stop
        notify.stop_listeners()
