"""Sagas: a block of steps, each with its compensation, that fails or is cancelled on demand.

``saga.run`` takes ``{"steps": [tag, ...], "fail": bool, "wait": bool, "parallel": bool,
"continue_on_error": bool, "undo": {tag: {...}}}``: for each tag it runs ``saga.do``
(ledger ``do:<tag>``) and adds ``saga.undo`` for it with ``undo[tag]`` merged into its
input; then it waits for the signal ``go`` when ``wait`` is set (where a cancellation
lands) and raises when ``fail`` is set. ``saga.undo`` records each attempt as
``undo:<tag>:<attempt>`` and can hold, fail a few times or fail for good.
"""

from __future__ import annotations

import os
import time
from typing import Any

import selvedge_django as sv
from tests.testapp.models import Ledger

UNDO_POLICY = sv.RetryPolicy(
    max_attempts=3, initial_interval=0.05, backoff_coefficient=1, max_interval=0.05
)


@sv.activity(name="saga.do")
def do(tag: str) -> str:
    """Record the step ``do:<tag>``."""
    Ledger.objects.create(entry=f"do:{tag}")
    return tag


@sv.activity(name="saga.undo", retry_policy=UNDO_POLICY, heartbeat_timeout=3)
def undo(data: dict[str, Any]) -> str:
    """Record ``undo:<tag>:<attempt>``; hold, fail or fail for good as ``data`` asks."""
    info = sv.activity_info()
    assert info is not None
    tag = data["tag"]
    Ledger.objects.create(entry=f"undo:{tag}:{info.attempt}")
    hold = data.get("hold_while")
    if hold and info.attempt in data.get("hold_on", [1]):
        deadline = time.monotonic() + 60
        while os.path.exists(hold) and time.monotonic() < deadline:
            sv.heartbeat()
            time.sleep(0.05)  # the activity's own work, polling its marker file
    if data.get("final"):
        raise sv.ApplicationError(f"cannot undo {tag}", type="UndoRefused", non_retryable=True)
    if info.attempt < data.get("fail_until", 0):
        raise RuntimeError(f"undo of {tag} failed on attempt {info.attempt}")
    Ledger.objects.create(entry=f"undone:{tag}")
    return tag


@sv.workflow(name="saga.run")
def saga_run(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    """Run the steps inside a saga; wait and fail as asked (see the module docstring)."""
    done: list[str] = []
    ctx.set_query_handler("done", lambda: list(done))
    with ctx.saga(
        parallel=data.get("parallel", False),
        continue_on_error=data.get("continue_on_error", False),
    ) as saga:
        for tag in data["steps"]:
            done.append(do.execute(ctx, tag))
            saga.add_compensation(undo, {"tag": tag, **data.get("undo", {}).get(tag, {})})
        if data.get("wait"):
            ctx.receive("go")
        if data.get("fail"):
            raise sv.ApplicationError("the order failed", type="OrderFailed", non_retryable=True)
    return done
