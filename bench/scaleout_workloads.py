"""Workflows of ``bench/scale_out.py`` (its worker processes load them through
``SELVEDGE["MODULES"]``); the ``django.tasks`` task is ``bench/tasks_bulk.py``'s."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv


@sv.workflow(name="bench.scaleout.noop")
def noop(ctx: sv.WorkflowContext, x: Any) -> Any:
    """Return the input: one dispatch and the close, nothing else (dispatch contention)."""
    return x
