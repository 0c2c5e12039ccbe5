"""Built-in workflows (autodiscovered like every app's ``workflows`` module).

``selvedge.prune`` runs :func:`selvedge_django.operations.prune` as an activity,
so that pruning can be a schedule instead of a cron job::

    SELVEDGE = {"SCHEDULES": {"prune": {
        "workflow": "selvedge.prune", "cron": "0 3 * * *", "input": {"older_than": "30d"}}}}

Its input: ``older_than`` (seconds, or text such as ``"30d"``, ``"12h"``,
``"90m"``), and optionally ``statuses`` (a list of closed statuses),
``workflow_name`` and ``batch_size``. It heartbeats after every batch and
returns ``{"deleted": n}``.

``selvedge.task`` runs one ``django.tasks`` task enqueued through
:class:`selvedge_django.tasks.SelvedgeBackend` (see ``tasks/runner.py``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from .engine.activity import heartbeat
from .engine.context import WorkflowContext
from .engine.options import RetryPolicy
from .registry import activity, workflow
from .tasks.runner import run_task, run_task_activity

__all__ = ["prune", "prune_activity", "run_task", "run_task_activity"]

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([dhms]?)\s*", re.IGNORECASE)
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "": 1}
_KEYS = {"older_than", "statuses", "workflow_name", "batch_size"}


def prune_options(options: Any) -> dict[str, Any]:
    """Validate the input of ``selvedge.prune``; raise ValueError naming the problem."""
    if not isinstance(options, dict):
        raise ValueError("selvedge.prune takes a dict such as {'older_than': '30d'}")
    unknown = sorted(set(options) - _KEYS)
    if unknown:
        raise ValueError(f"unknown selvedge.prune options {unknown}; use {sorted(_KEYS)}")
    older = options.get("older_than")
    if isinstance(older, bool) or not isinstance(older, int | float | str):
        raise ValueError("older_than must be seconds or text such as '30d', '12h', '90m'")
    if isinstance(older, str):
        match = _DURATION.fullmatch(older)
        if match is None:
            raise ValueError(f"older_than {older!r} is not a duration such as '30d', '12h'")
        seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    else:
        seconds = float(older)
    if not 0 <= seconds < 1e10:
        raise ValueError(f"older_than must be a non-negative duration, not {older!r}")
    batch_size = options.get("batch_size", 500)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError("batch_size must be a positive integer")
    statuses = options.get("statuses")
    if statuses is not None and (
        not isinstance(statuses, list) or not all(isinstance(s, str) for s in statuses)
    ):
        raise ValueError("statuses must be a list of closed statuses")
    name = options.get("workflow_name")
    if name is not None and not isinstance(name, str):
        raise ValueError("workflow_name must be a string")
    return {
        "older_than": timedelta(seconds=seconds),
        "statuses": statuses,
        "workflow_name": name,
        "batch_size": batch_size,
    }


@activity(
    name="selvedge.prune",
    start_to_close_timeout=3600,
    heartbeat_timeout=600,
    retry_policy=RetryPolicy(max_attempts=3, non_retryable_errors=(ValueError, TypeError)),
)
def prune_activity(options: dict[str, Any]) -> dict[str, int]:
    """Delete closed instances as ``runselvedge prune`` does; heartbeat after each batch."""
    from .operations import prune as prune_instances

    checked = prune_options(options)
    deleted = prune_instances(
        checked["older_than"],
        statuses=checked["statuses"],
        workflow_name=checked["workflow_name"],
        batch_size=checked["batch_size"],
        progress=lambda total: heartbeat(),
    )
    return {"deleted": deleted}


@workflow(name="selvedge.prune")
def prune(ctx: WorkflowContext, options: dict[str, Any]) -> dict[str, int]:
    """Prune closed instances (one activity): schedule it with SELVEDGE["SCHEDULES"]."""
    return prune_activity.execute(ctx, options)
