"""Flow control: an activity that records when each attempt starts and ends."""

from __future__ import annotations

import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger


@sv.activity(name="flow.span")
def span(data: dict[str, Any]) -> str:
    """Record ``flow:<tag>:start``, hold ``hold`` seconds, record ``flow:<tag>:end``.

    Each row is its own commit, so the ledger's id order is the order in which
    attempts started and ended across processes.
    """
    Ledger.objects.create(entry=f"flow:{data['tag']}:start")
    time.sleep(float(data.get("hold", 0)))  # the attempt's work
    Ledger.objects.create(entry=f"flow:{data['tag']}:end")
    return str(data["tag"])


@sv.activity(name="flow.serial", priority=5, max_concurrency=1)
def serial(data: dict[str, Any]) -> str:
    """``flow.span`` with flow control defaults on the definition."""
    return span.fn(data)


@sv.workflow(name="flow.run")
def run(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Run ``flow.span`` (or ``activity``) once with the per-call ``options``."""
    options = sv.ActivityOptions(**data.get("options", {}))
    activity = serial if data.get("activity") == "flow.serial" else span
    return activity.execute(ctx, data, options=options)


@sv.workflow(name="flow.backlog")
def backlog(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    """Issue ``flow.span`` for each ``[tag, priority]`` of ``tasks`` in the background,
    then wait for each in issue order."""
    futures = [
        span.execute_async(ctx, {"tag": tag}, options=sv.ActivityOptions(priority=priority))
        for tag, priority in data["tasks"]
    ]
    return [future.get(ctx) for future in futures]
