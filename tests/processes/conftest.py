"""Every test in this folder carries the ``processes`` marker.

The folder holds tests with real ``runselvedge worker`` processes, killed and restarted: the
slow part, which ``-m "not processes"`` leaves out.
"""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    item.add_marker(pytest.mark.processes)
