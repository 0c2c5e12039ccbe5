"""Every test in this folder carries the ``integration`` marker.

The folder holds tests of the store, the operations layer and the worker loops on a real
database, driven in-process with worker threads.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.integration)


@pytest.fixture
def task_calls() -> Iterator[list[tuple[str, object]]]:
    """What the django.tasks tasks of tests/testapp/tasks.py did, cleared before and after."""
    from tests.testapp import tasks

    with tasks.calls_lock:
        tasks.calls.clear()
    yield tasks.calls
    with tasks.calls_lock:
        tasks.calls.clear()
