"""Every test in this folder carries the ``conformance`` marker."""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.conformance)
