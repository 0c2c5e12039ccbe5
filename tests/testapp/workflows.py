"""Workflows and activities the test suite (and its worker subprocesses) share."""

from __future__ import annotations

import os
import time
from typing import Any

import selvedge_django as sv

from .models import Ledger


@sv.activity(name="test.add")
def add(data: dict[str, int]) -> int:
    return data["a"] + data["b"]


@sv.activity(name="test.record")
def record(entry: str) -> str:
    Ledger.objects.create(entry=entry)
    return entry


@sv.activity(name="test.slow_record")
def slow_record(data: dict[str, Any]) -> str:
    """Record an entry after waiting for a marker file to disappear (crash tests)."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    marker = data.get("hold_while")
    deadline = time.monotonic() + 60
    while marker and os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return data["entry"]


@sv.workflow(name="test.sum3")
def sum3(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
    x = add.execute(ctx, {"a": data["a"], "b": data["b"]})
    y = add.execute(ctx, {"a": x, "b": data["c"]})
    return add.execute(ctx, {"a": y, "b": 0})


@sv.workflow(name="test.ledger")
def ledger(ctx: sv.WorkflowContext, entries: list[str]) -> list[str]:
    return [record.execute(ctx, entry) for entry in entries]


@sv.workflow(name="test.crashable")
def crashable(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    first = record.execute(ctx, "before")
    second = slow_record.execute(ctx, data)
    return f"{first}+{second}"


# -- many workers on one database (tests/test_scale.py) --------------------------------


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


# -- faults and crashes (tests/test_crash_matrix.py, tests/test_faults.py, bench/soak.py) --

FAULT_PARKED_QUEUE = "fault.parked"  # no worker of the fault tests serves it

_FAULT_RETRY = sv.RetryPolicy(
    max_attempts=5, initial_interval=0.05, backoff_coefficient=1.0, max_interval=0.05
)


class FaultStepError(Exception):
    """A retryable failure of ``fault.step``."""


@sv.activity(name="fault.step", retry_policy=_FAULT_RETRY)
def fault_step(data: dict[str, Any]) -> str:
    """Record ``fault:<tag>:<attempt>``; fail (retryably) before attempt ``succeed_on``."""
    info = sv.activity_info()
    assert info is not None
    Ledger.objects.create(entry=f"fault:{data['tag']}:{info.attempt}")
    if info.attempt < data.get("succeed_on", 1):
        raise FaultStepError(f"attempt {info.attempt} of {data['tag']} failed")
    return str(data["tag"])


@sv.workflow(name="fault.child")
def fault_child(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    return "child:" + fault_step.execute(ctx, {"tag": data["tag"]})


@sv.workflow(name="fault.flow")
def fault_flow(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Every kind of durable step once: activities (one retried), a timer, two signals on
    ``go`` (one with a timeout), a child, and a cancelled scope holding a timer and a
    task that no worker serves."""
    tag = data["tag"]
    first = fault_step.execute(ctx, {"tag": f"{tag}:first"})
    flaky = fault_step.execute(ctx, {"tag": f"{tag}:flaky", "succeed_on": 2})
    ctx.sleep(data.get("sleep", 0.1))
    signals = [ctx.receive("go"), ctx.receive_with_timeout("go", 600)]
    child = ctx.start_child("fault.child", {"tag": f"{tag}:child"}).get(ctx)
    scoped, cancel = ctx.with_cancel()
    timer = scoped.new_timer(3600)
    parked = fault_step.execute_async(
        scoped, {"tag": f"{tag}:parked"}, options=sv.ActivityOptions(queue=FAULT_PARKED_QUEUE)
    )
    cancel()
    cancelled = 0
    for handle in (timer, parked):
        try:
            handle.get(ctx)
        except sv.ScopeCancelled:
            cancelled += 1
    return {
        "first": first,
        "flaky": flaky,
        "signals": signals,
        "child": child,
        "cancelled": cancelled,
    }
