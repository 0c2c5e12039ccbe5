"""Many workers on one database: steps that say which worker ran them."""

from __future__ import annotations

import os
from typing import Any

import selvedge_django as sv

from ..models import Ledger


@sv.activity(name="scale.step")
def scale_step(data: dict[str, Any]) -> int:
    """Record ``scale:<tag>:<i>`` (a second run of one attempt would record it twice)."""
    Ledger.objects.create(entry=f"scale:{data['tag']}:{data['i']}")
    return int(data["i"]) + 1


@sv.workflow(name="scale.three")
def scale_three(ctx: sv.WorkflowContext, tag: str) -> int:
    """Three recorded steps in a row; returns 1 + 2 + 3."""
    return sum(scale_step.execute(ctx, {"tag": tag, "i": i}) for i in range(3))


@sv.activity(name="scale.on_queue")
def scale_on_queue(data: dict[str, Any]) -> int:
    """Record which queue's task this process ran: ``scale.queue:<queue>:<tag>:<pid>``."""
    Ledger.objects.create(entry=f"scale.queue:{data['queue']}:{data['tag']}:{os.getpid()}")
    return os.getpid()


@sv.workflow(name="scale.queued")
def scale_queued(ctx: sv.WorkflowContext, data: dict[str, Any]) -> int:
    """Run scale.on_queue on ``data["queue"]``; return the pid of the process that ran it."""
    options = sv.ActivityOptions(queue=data["queue"])
    return scale_on_queue.execute(ctx, data, options=options)
