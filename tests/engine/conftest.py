"""Every test in this folder carries the ``engine`` marker.

The folder holds tests of the engine alone and of the package's layout: no database, no worker
process; the fastest loop.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.engine)
