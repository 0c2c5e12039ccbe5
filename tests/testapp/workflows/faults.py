"""The fault and crash tests' workflows (both crash matrices, the soak)."""

from __future__ import annotations

import os
import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger
from .basics import add

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


@sv.activity(name="fault.hold", retry_policy=_FAULT_RETRY)
def fault_hold(data: dict[str, Any]) -> str:
    """Hold while the ``hold_while`` file exists (never heartbeating); return the attempt."""
    info = sv.activity_info()
    assert info is not None
    Ledger.objects.create(entry=f"fault.hold:{data['tag']}:{info.attempt}:start")
    deadline = time.monotonic() + 60
    while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    Ledger.objects.create(entry=f"fault.hold:{data['tag']}:{info.attempt}:done")
    return f"{data['tag']}:attempt {info.attempt}"


@sv.workflow(name="fault.stall")
def fault_stall(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    held = fault_hold.execute(ctx, data)
    return [held, fault_step.execute(ctx, {"tag": f"{data['tag']}:after"})]


@sv.activity(name="fault.sized", retry_policy=_FAULT_RETRY)
def fault_sized(data: dict[str, Any]) -> str:
    """Return ``size`` characters, or fail with a message and details that large."""
    Ledger.objects.create(entry=f"fault.sized:{data.get('tag', '')}")
    if data.get("fail"):
        raise sv.ApplicationError(
            "m" * data["size"],
            type="Huge",
            details={"blob": "d" * data["size"]},
            non_retryable=True,
        )
    return "x" * data["size"]


@sv.workflow(name="fault.limits")
def fault_limits(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """Exercise MAX_PAYLOAD_BYTES on one path (``mode``) with a value of ``size``."""
    mode, size = data["mode"], data["size"]
    if mode == "output":
        return "o" * size
    if mode == "signal":
        return len(ctx.receive("big"))
    try:
        if mode == "activity_result":
            return len(fault_sized.execute(ctx, {"size": size, "tag": ctx.instance_id}))
        if mode == "activity_error":
            return fault_sized.execute(ctx, {"size": size, "fail": True, "tag": ctx.instance_id})
        if mode == "activity_input":
            return fault_sized.execute(ctx, {"size": 1, "pad": "i" * size})
        if mode == "child_input":
            return ctx.start_child("fault.child", {"tag": "c" * size}).get(ctx)
        if mode == "child_nul":
            return ctx.start_child("fault.child", {"tag": "nul\x00"}).get(ctx)
    except (sv.PayloadTooLarge, sv.WorkflowStartRejected, sv.ApplicationError) as error:
        # What workflow code sees, then one more step: the workflow goes on.
        after = fault_step.execute(ctx, {"tag": f"{ctx.instance_id}:after"})
        return {"error": type(error).__name__, "message": str(error)[:300], "after": after}
    raise ValueError(f"unknown mode {mode!r}")


@sv.activity(name="fault.deep", retry_policy=_FAULT_RETRY)
def fault_deep(depth: int) -> Any:
    """Return a list nested ``depth`` levels deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@sv.workflow(name="fault.deep_result")
def fault_deep_result(ctx: sv.WorkflowContext, depth: int) -> Any:
    """Call fault.deep and report the error the workflow sees."""
    try:
        return fault_deep.execute(ctx, depth)
    except sv.ApplicationError as error:
        return {"error": error.type, "message": error.message[:300]}
    except sv.SelvedgeError as error:
        return {"error": type(error).__name__, "message": str(error)[:300]}


FAULT_BG_QUEUE = "fault.bg"  # served only by that matrix's activity-only worker


@sv.activity(name="fault.tx", transactional=True, retry_policy=_FAULT_RETRY)
def fault_tx(data: dict[str, Any]) -> str:
    """Record ``fault.tx:<tag>`` in the attempt's own transaction: once, whatever fails."""
    Ledger.objects.create(entry=f"fault.tx:{data['tag']}")
    return str(data["tag"])


@sv.activity(name="fault.cancel_self", retry_policy=_FAULT_RETRY)
def fault_cancel_self(reason: str) -> None:
    """Ask for the cancellation of this attempt's own workflow."""
    info = sv.activity_info()
    assert info is not None
    sv.cancel_workflow(info.instance_id, reason)


@sv.workflow(name="fault.waiter")
def fault_waiter(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Wait for a signal that never comes (until cancelled)."""
    return ctx.receive("never")


@sv.workflow(name="fault.flow2")
def fault_flow2(ctx: sv.WorkflowContext, data: dict[str, Any]) -> Any:
    """The steps fault.flow leaves out: a transactional activity, a wait_condition delivery
    (two signals on ``w``), a background step on FAULT_BG_QUEUE (the reservation releases
    the lease), a schedule-to-start timeout only the leader's sweep records, and a
    cancellation requested from inside the run that closes it with its child."""
    tag = data["tag"]
    fault_tx.execute(ctx, {"tag": f"{tag}:tx"})
    ctx.wait_condition(lambda: ctx.pending("w") >= 2)
    ctx.receive("w")
    ctx.receive("w")
    fault_step.execute(ctx, {"tag": f"{tag}:bg"}, options=sv.ActivityOptions(queue=FAULT_BG_QUEUE))
    late = sv.ActivityOptions(queue=FAULT_PARKED_QUEUE, schedule_to_start_timeout=0.3)
    try:
        fault_step.execute(ctx, {"tag": f"{tag}:late"}, options=late)
    except sv.ActivityTimeoutError:
        pass
    ctx.start_child("fault.waiter")
    fault_cancel_self.execute(ctx, "flow2 is done")
    return ctx.receive("never")  # the cancellation ends the run here; the close cancels the child


@sv.workflow(name="poison.keys")
def poison_keys(ctx: sv.WorkflowContext, _: Any) -> list[str]:
    """Give keys and a queue that no database can store (NUL, a lone surrogate); return the
    type of each error raised (nothing may be written for any of them)."""
    attempts: list[Any] = [
        lambda: ctx.sleep(1, sleep_id="nul\x00inside"),
        lambda: ctx.new_timer(1, sleep_id="\ud800"),
        lambda: add.execute(ctx, {"a": 1, "b": 2}, activity_id="lone\udfff"),
        lambda: add.execute(ctx, {"a": 1, "b": 2}, options=sv.ActivityOptions(queue="q\x00")),
        lambda: add.execute(ctx, {"a": 1, "b": 2}, options=sv.ActivityOptions(queue="\ud800")),
    ]
    raised = []
    for attempt in attempts:
        try:
            attempt()
            raised.append("accepted")
        except (sv.HistoryKeyConflict, ValueError) as error:
            raised.append(type(error).__name__)
    return raised
