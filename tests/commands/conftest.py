"""Every test in this folder carries the ``commands`` marker.

The folder holds the ``runselvedge`` command's tests, through ``call_command`` and short
subprocesses.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.commands)
