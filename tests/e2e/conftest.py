"""Every test in this folder carries the ``e2e`` marker.

The folder holds the browser test: the example shop and the admin in a headless Chromium.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.e2e)
