"""Every test in this folder carries the ``integration`` marker.

The folder holds tests of the store, the operations layer and the worker loops on a real
database, driven in-process with worker threads.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.integration)
