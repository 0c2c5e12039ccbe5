"""What the status report and the admin's timeline are tested with."""

from __future__ import annotations

from typing import Any

import selvedge_django as sv


@sv.activity(name="status.parked", queue="status-parked")
def parked(value: Any) -> Any:
    """Queued on "status-parked", which the status tests' workers never serve."""
    return value


@sv.workflow(name="status.parked_flow")
def parked_flow(ctx: sv.WorkflowContext, value: Any) -> Any:
    return parked.execute(ctx, value)


@sv.workflow(name="status.nap")
def nap(ctx: sv.WorkflowContext, seconds: float) -> str:
    ctx.sleep(seconds)
    return "rested"


@sv.workflow(name="status.ticks")
def ticks(ctx: sv.WorkflowContext, n: int) -> int:
    """Receive ``n`` "tick" signals: one command position each."""
    for _ in range(n):
        ctx.receive("tick")
    return n


class NotYet(Exception):
    """A retryable failure of the timeline's activities."""


@sv.activity(
    name="status.flaky",
    retry_policy=sv.RetryPolicy(max_attempts=3, initial_interval=0.05, max_interval=0.05),
)
def flaky(tag: str) -> str:
    """Fail the first attempt, succeed the second: one retry with a backoff."""
    info = sv.activity_info()
    assert info is not None
    if info.attempt < 2:
        raise NotYet(f"attempt {info.attempt} of {tag} failed")
    return tag


@sv.activity(
    name="status.backing_off",
    retry_policy=sv.RetryPolicy(max_attempts=5, initial_interval=600, max_interval=600),
)
def backing_off(tag: str) -> str:
    """Always fail: after the first attempt it waits ten minutes for the next."""
    raise NotYet(f"<i>{tag}</i> is not ready")


# A name that is markup, quotes and an entity: the admin must show it as text.
HOSTILE = "status.<script>alert(\"x\")</script>&amp;'q'"


@sv.activity(name=HOSTILE)
def hostile(value: Any) -> Any:
    return value


@sv.workflow(name="status.tour")
def tour(ctx: sv.WorkflowContext, _: Any) -> str:
    """One step of each kind: an activity retried once, a timer, a clock read, a signal, a
    child and the activity with the hostile name."""
    flaky.execute(ctx, "first")
    ctx.sleep(0.05)
    ctx.now()
    ctx.receive("go")
    ctx.start_child("child.echo", "hi").get(ctx)
    hostile.execute(ctx, 1)
    return "toured"


@sv.workflow(name='status.<b>stalled</b> & "held"')
def stalled(ctx: sv.WorkflowContext, _: Any) -> str:
    """An activity that fails and then waits a long backoff: running, in backoff."""
    hostile.execute(ctx, 2)
    return backing_off.execute(ctx, "later")


@sv.workflow(name="status.generations")
def generations(ctx: sv.WorkflowContext, left: int) -> Any:
    """Continue as new ``left`` times, then wait for "done": many dispatches, few commands
    per generation."""
    if left > 0:
        ctx.continue_as_new(left - 1)
    return ctx.receive("done")
