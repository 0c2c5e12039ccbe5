"""Every test in this folder carries the ``admin`` marker.

The folder holds the admin console's tests, through Django's test client.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.admin)
