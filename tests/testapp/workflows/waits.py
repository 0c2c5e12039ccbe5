"""Waits: signals, timers, conditions and workflow time."""

from __future__ import annotations

import os
import time
from typing import Any

import selvedge_django as sv

from ..models import Ledger
from .basics import add


@sv.activity(name="wait.manual", queue="manual")
def wait_manual(data: Any) -> Any:
    """Queued on "manual", which the wait tests' workers never serve: tests complete it."""
    return data


@sv.workflow(name="wait.receive")
def wait_receive(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    """Receive once from each of ``data["channels"]``, in order; return the payloads."""
    return [ctx.receive(channel) for channel in data["channels"]]


@sv.workflow(name="wait.inbox")
def wait_inbox(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
    """receive_async and pending on channel "c" around two batching receives of "go"."""
    seen: dict[str, Any] = {"async_empty": list(ctx.receive_async("c"))}
    seen["pending_before"] = ctx.pending("c")
    seen["go"] = ctx.receive("go")
    seen["pending_after_go"] = ctx.pending("c")
    seen["async"] = list(ctx.receive_async("c"))
    seen["pending_after_async"] = ctx.pending("c")
    ctx.receive("go")
    seen["pending_end"] = ctx.pending("c")
    return seen


@sv.workflow(name="wait.sleep")
def wait_sleep(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Sleep ``seconds`` in ``form`` (sleep, timer, until, timedelta); return times around it."""
    from datetime import timedelta

    before = ctx.now()
    seconds = data["seconds"]
    form = data.get("form", "sleep")
    sleep_id = data.get("sleep_id")
    fired_at = None
    if form == "sleep":
        ctx.sleep(seconds, sleep_id=sleep_id)
    elif form == "timedelta":
        ctx.sleep(timedelta(seconds=seconds), sleep_id=sleep_id)
    elif form == "until":
        ctx.sleep_until(before + timedelta(seconds=seconds), sleep_id=sleep_id)
    else:
        fired_at = ctx.new_timer(seconds, sleep_id=sleep_id).get(ctx).isoformat()
    return {"before": before.isoformat(), "after": ctx.now().isoformat(), "fired_at": fired_at}


@sv.workflow(name="wait.timer_handle")
def wait_timer_handle(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """new_timer, optionally a receive of "poke" while it is armed, then Timer.get twice."""
    from datetime import timedelta

    timer = ctx.new_timer(data["seconds"])
    ready_before = timer.is_ready()
    if data.get("poke"):
        ctx.receive("poke")
    fired_at = timer.get(ctx)
    return {
        "key": timer.key,
        "ready_before": ready_before,
        "fired_at": fired_at.isoformat(),
        "utc": fired_at.utcoffset() == timedelta(0),
        "ready_after": timer.is_ready(),
        "get_again_equal": timer.get(ctx) == fired_at,
    }


@sv.workflow(name="wait.bad_duration")
def wait_bad_duration(ctx: sv.WorkflowContext, kind: str) -> str:
    """Issue a wait with a nonsensical duration (the run fails with TypeError/ValueError)."""
    from datetime import datetime

    if kind == "nan":
        ctx.sleep(float("nan"))
    elif kind == "inf_timeout":
        ctx.receive_with_timeout("c", float("inf"))
    elif kind == "string":
        ctx.sleep("5")  # type: ignore[arg-type]
    elif kind == "bool":
        ctx.new_timer(True)
    elif kind == "none":
        ctx.sleep(None)  # type: ignore[arg-type]
    elif kind == "naive_until":
        ctx.sleep_until(datetime(2030, 1, 1))
    elif kind == "until_not_datetime":
        ctx.sleep_until(5)  # type: ignore[arg-type]
    return "no error"


@sv.workflow(name="wait.receive_timeout")
def wait_receive_timeout(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """receive_with_timeout on "c"; then, if ``then`` names a channel, receive from it."""
    try:
        got: Any = {"signal": ctx.receive_with_timeout("c", data["timeout"])}
    except sv.ReceiveTimeout as error:
        got = {"timeout": isinstance(error, TimeoutError)}
    if data.get("then"):
        got["then"] = ctx.receive(data["then"])
    return got


@sv.workflow(name="wait.condition")
def wait_condition_flow(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
    """Wait for either of two activities; report readiness before and after a receive."""
    first = add.execute_async(ctx, {"a": 1, "b": 2})
    second = wait_manual.execute_async(ctx, "manual")
    ctx.wait_condition(lambda: first.is_ready() or second.is_ready())
    seen: dict[str, Any] = {"first": first.is_ready(), "second": second.is_ready()}
    ctx.receive("go")
    seen["second_after_receive"] = second.is_ready()
    seen["values"] = [first.get(ctx), second.get(ctx)]
    return seen


@sv.workflow(name="wait.get_no_batch")
def wait_get_no_batch(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Timer.get returns a fire without delivering an activity result that arrived first."""
    manual = wait_manual.execute_async(ctx, "m")
    timer = ctx.new_timer(data["seconds"])
    timer.get(ctx)
    seen: dict[str, Any] = {"manual_after_get": manual.is_ready(), "timer": timer.is_ready()}
    ctx.wait_condition(lambda: manual.is_ready())
    seen["manual_after_condition"] = manual.is_ready()
    seen["value"] = manual.get(ctx)
    return seen


@sv.workflow(name="wait.bad_predicate")
def wait_bad_predicate(ctx: sv.WorkflowContext, mode: str) -> str:
    """wait_condition with a None, command-issuing, raising or bad-pending predicate."""
    predicate: Any
    if mode == "none":
        predicate = None
    elif mode == "command":

        def predicate() -> bool:
            return ctx.now() is None

    elif mode == "pending":

        def predicate() -> bool:
            return ctx.pending("") > 0

    else:

        def predicate() -> bool:
            raise LookupError("the predicate broke")

    try:
        ctx.wait_condition(predicate)
    except Exception as error:
        return f"swallowed {type(error).__name__}"
    return "returned"


@sv.workflow(name="wait.time")
def wait_time(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[str]:
    """now() twice, sleep, now(), then a timer's fire: the values workflow code saw."""
    values = [ctx.now(), ctx.now()]
    ctx.sleep(data["seconds"])
    values.append(ctx.now())
    values.append(ctx.new_timer(data["seconds"]).get(ctx))
    return [value.isoformat() for value in values]


@sv.activity(name="wait.hold")
def wait_hold(data: dict[str, Any]) -> str:
    """Record a start, then wait (heartbeating) while the marker file exists."""
    Ledger.objects.create(entry=f"started:{data['entry']}")
    deadline = time.monotonic() + 60
    while os.path.exists(data["hold_while"]) and time.monotonic() < deadline:
        sv.heartbeat()
        time.sleep(0.02)
    return str(data["entry"])


@sv.workflow(name="wait.receive_around_hold")
def wait_receive_around_hold(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    """Run wait.hold inline (the execution keeps its lease), then receive "during"."""
    return [wait_hold.execute(ctx, data), ctx.receive("during")]


def _crash_here(point: str) -> None:
    """SIGKILL this process at ``point`` when the worker was started to crash there."""
    import signal

    if os.environ.get("SELVEDGE_WAIT_CRASH") == point:
        os.kill(os.getpid(), signal.SIGKILL)


@sv.workflow(name="wait.crash_timer")
def wait_crash_timer(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    """Arm a timer, die before suspending (in the crashing worker), then wait for it."""
    timer = ctx.new_timer(data["seconds"])
    _crash_here("timer_reserved")
    return timer.get(ctx).isoformat()


@sv.workflow(name="wait.crash_receive")
def wait_crash_receive(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
    """Receive twice from "c"; the crashing worker dies inside or right after the first.

    Inside: right after the statement that consumes the signal, in the observation's
    transaction; where the observation is one statement (PostgreSQL outside a
    caller's transaction), which commits whole or not at all, just before it runs.
    """
    if os.environ.get("SELVEDGE_WAIT_CRASH") == "receive_mid_commit":
        from django.db import connection

        def die_after_consuming(execute: Any, sql: str, *args: Any) -> Any:
            statement = sql.lstrip().upper()
            if statement.startswith("WITH") and "consumed_seq" in sql:
                _crash_here("receive_mid_commit")  # before the one-statement observation
            result = execute(sql, *args)
            if statement.startswith("UPDATE") and "consumed_seq" in sql:
                _crash_here("receive_mid_commit")  # inside the observation's transaction
            return result

        connection.execute_wrappers.append(die_after_consuming)
    first = ctx.receive("c")
    _crash_here("receive_committed")
    return [first, ctx.receive("c")]


@sv.workflow(name="wait.deadline")
def wait_deadline(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Wait for wait.manual with a one-hour schedule-to-start timeout."""
    options = sv.ActivityOptions(schedule_to_start_timeout=3600)
    try:
        return wait_manual.execute(ctx, "served", options=options)
    except sv.ActivityTimeoutError as error:
        return {"timeout": error.kind}


@sv.workflow(name="child.catch_get")
def child_catch_get(ctx: sv.WorkflowContext, _: Any) -> str:
    """Catch a cancellation observed by a blocked child.get(), then wait before returning."""
    child = ctx.start_child("child.waiter")
    try:
        child.get(ctx)
        caught = "not cancelled"
    except sv.WorkflowCancelled as error:
        caught = error.reason
    ctx.detached().receive("go")
    return caught
