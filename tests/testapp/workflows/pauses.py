"""Pausing: workflows whose steps show what a pause holds back and what it lets through."""

from __future__ import annotations

import threading
from typing import Any

import selvedge_django as sv

# Set by a test to let pause.gated's first execution go on (None: no gate).
GATE: dict[str, threading.Event] = {}
# Set when pause.gated's first execution reached the gate.
AT_GATE = threading.Event()


@sv.activity(name="pause.echo", queue="pq")
def pause_echo(data: Any) -> Any:
    """Return ``data``; queued on "pq", the queue the pause tests pause."""
    return data


@sv.activity(name="pause.other", queue="other")
def pause_other(data: Any) -> Any:
    """Return ``data``; queued on "other", a queue the tests leave running (a witness)."""
    return data


@sv.activity(name="pause.held_echo", queue="pq")
def pause_held_echo(data: Any) -> Any:
    """Return ``data`` once the test's gate ``data`` opens (an attempt that is running
    while its instance or queue is paused)."""
    gate = GATE.get(str(data))
    if gate is not None:
        AT_GATE.set()
        gate.wait(30)
    return data


@sv.workflow(name="pause.activity")
def pause_activity(ctx: sv.WorkflowContext, data: Any) -> Any:
    """One activity on queue "pq", then its result."""
    return pause_echo.execute(ctx, data)


@sv.workflow(name="pause.other")
def pause_other_wf(ctx: sv.WorkflowContext, data: Any) -> Any:
    """One activity on queue "other", then its result."""
    return pause_other.execute(ctx, data)


@sv.workflow(name="pause.held")
def pause_held(ctx: sv.WorkflowContext, data: Any) -> Any:
    """pause.held_echo(data) (its attempt waits for the test's gate), then a signal "go"."""
    value = pause_held_echo.execute(ctx, data)
    return [value, ctx.receive("go")]


@sv.workflow(name="pause.timers")
def pause_timers(ctx: sv.WorkflowContext, _: Any) -> list[str]:
    """Three timers of 10, 20 and 30 seconds, waited for in reverse; the keys in the
    order of their ``now()`` after each."""
    timers = [ctx.new_timer(seconds, sleep_id=f"t{seconds}") for seconds in (10, 20, 30)]
    for timer in reversed(timers):
        timer.get(ctx)
    return [timer.key for timer in timers]


@sv.workflow(name="pause.receive")
def pause_receive(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Receive once on "go"; cancellable while it waits."""
    return ctx.receive("go")


@sv.workflow(name="pause.gated")
def pause_gated(ctx: sv.WorkflowContext, _: Any) -> Any:
    """An execution that, the first time it runs, waits for the test's gate before its
    first command (so a test can pause it while it runs), then an activity."""
    gate = GATE.get("gated")
    if gate is not None and not ctx.is_replaying:
        AT_GATE.set()
        gate.wait(30)
    return pause_other.execute(ctx, "after the gate")
