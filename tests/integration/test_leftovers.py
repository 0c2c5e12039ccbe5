"""Leftover recorded commands: changed code that stops before its recorded history ends.

The seeds: "Command changes and leftover commands produce NondeterminismError".
A run stops where its code returns, raises, is cancelled or waits; every command
that history records past that position is one the changed code no longer
reaches. Live, the instance closes as failed with a ``NondeterminismError``;
``replay_history``, ``replay_instance`` and ``runselvedge replay-check`` report
the divergence. A run that fails at the position it always failed at is not a
divergence, and a wait may still reach the futures the recorded run had issued
but not awaited.
"""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import selvedge_django as sv
from selvedge_django.engine.portable import ABSENT
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker


@sv.activity(name="ops.left.step")
def step(n: int) -> int:
    return n * 10


@sv.activity(name="ops.left.unserved", queue="ops-left-unserved")
def unserved(n: int) -> int:
    return n  # no worker of these tests serves its queue


@sv.workflow(name="ops.left.two_steps")
def two_steps(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Two recorded activities, then a wait for "go"."""
    a = step.execute(ctx, 1)
    b = step.execute(ctx, 2)
    return [a, b, ctx.receive("go")]


@sv.workflow(name="ops.left.three_then_fail")
def three_then_fail(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Three activities, then a failure."""
    for n in (1, 2, 3):
        step.execute(ctx, n)
    raise sv.ApplicationError("out of stock", type="OutOfStock")


@sv.workflow(name="ops.left.ahead")
def ahead(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Issue a future it does not await, run a step, then wait for "go"."""
    unserved.execute_async(ctx, 1)
    step.execute(ctx, 2)
    return ctx.receive("go")


def fails_at_once(ctx: sv.WorkflowContext, _: Any) -> Any:
    raise sv.ApplicationError("changed code fails at once", type="Changed")


def cancelled_at_once(ctx: sv.WorkflowContext, _: Any) -> Any:
    raise sv.ScopeCancelled()


def fails_after_first_step(ctx: sv.WorkflowContext, _: Any) -> Any:
    step.execute(ctx, 1)
    raise sv.ApplicationError("changed code fails after one step", type="Changed")


@pytest.fixture
def stepper(tdb: None, selvedge_clock: ControllableClock) -> Worker:
    return Worker(activity_queues=[""])


def replay_check() -> tuple[str, str]:
    """Run ``runselvedge replay-check``; return (its error or "", what it printed)."""
    out = StringIO()
    try:
        call_command("runselvedge", "replay-check", stdout=out, stderr=StringIO())
    except CommandError as error:
        return str(error), out.getvalue()
    return "", out.getvalue()


@pytest.mark.parametrize(
    ("changed", "ending"),
    [
        (fails_at_once, "raise"),
        (cancelled_at_once, "cancel"),
        (fails_after_first_step, "raise"),
    ],
)
def test_changed_code_that_stops_early_diverges_live_and_in_every_check(
    stepper: Worker, redefine: Any, changed: Any, ending: str
) -> None:
    iid = sv.start_workflow(two_steps, instance_id=f"left-{changed.__name__}")
    run_until_idle(stepper)
    assert [e.command for e in sv.export_history(iid).events] == ["activity", "activity"]
    redefine("ops.left.two_steps", changed)

    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_instance(iid)
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.NondeterminismError)
    assert divergence.actual == ending
    assert divergence.expected == "activity"
    # The error the changed code raised is kept next to the divergence.
    assert isinstance(caught.value.workflow_error, sv.ApplicationError | sv.ScopeCancelled)

    error, printed = replay_check()
    assert error == "1 of 1 histories diverged"
    assert printed.startswith(f"DIVERGED {iid}: ")
    assert "    NondeterminismError: " in printed

    sv.signal(iid, "go", "now")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.NondeterminismError), result.error
    assert "before recorded command" in str(result.error)


def test_a_failure_where_the_recorded_run_failed_is_no_divergence(
    stepper: Worker, redefine: Any
) -> None:
    iid = sv.start_workflow(three_then_fail, instance_id="left-same-failure")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed" and isinstance(result.error, sv.ApplicationError)
    sv.replay_instance(iid)  # fails at position 3 after recording 3 commands: fine

    def fails_differently(ctx: sv.WorkflowContext, _: Any) -> Any:
        three_then_fail.fn(ctx, _)

    redefine("ops.left.three_then_fail", fails_differently)
    sv.replay_instance(iid)  # the same commands and the same failure


def test_a_closed_history_replayed_with_code_that_raises_at_once(
    stepper: Worker, redefine: Any
) -> None:
    """The reproduction: three activities then a failure, new code raises at once."""
    iid = sv.start_workflow(three_then_fail, instance_id="left-closed")
    run_until_idle(stepper)
    history = sv.export_history(iid)

    def raises_the_same_error_at_once(ctx: sv.WorkflowContext, _: Any) -> Any:
        raise sv.ApplicationError("out of stock", type="OutOfStock")

    redefine("ops.left.three_then_fail", raises_the_same_error_at_once)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(history)
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.NondeterminismError)
    assert (divergence.key, divergence.actual) == ("#1:ops.left.step", "raise")


def test_a_wait_before_recorded_observations_diverges(stepper: Worker, redefine: Any) -> None:
    iid = sv.start_workflow(ahead, instance_id="left-wait")
    run_until_idle(stepper)  # the future stays queued; step 2 is recorded; waits for "go"

    def awaits_first(ctx: sv.WorkflowContext, _: Any) -> Any:
        unserved.execute_async(ctx, 1).get(ctx)  # waits where the recorded run went on
        step.execute(ctx, 2)
        return ctx.receive("go")

    redefine("ops.left.ahead", awaits_first)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_instance(iid)
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.NondeterminismError)
    assert (divergence.key, divergence.actual) == ("#2:ops.left.step", "wait")

    sv.signal(iid, "go")
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.NondeterminismError)


def test_a_wait_before_futures_the_recorded_run_had_not_awaited_is_no_divergence(
    stepper: Worker, redefine: Any
) -> None:
    def issues_two(ctx: sv.WorkflowContext, _: Any) -> Any:
        first = unserved.execute_async(ctx, 1)
        unserved.execute_async(ctx, 2)
        return first.get(ctx)

    redefine("ops.left.ahead", issues_two)
    iid = sv.start_workflow("ops.left.ahead", instance_id="left-futures")
    run_until_idle(stepper)
    assert [e.data for e in sv.export_history(iid).events] == [ABSENT] * 2

    def awaits_before_the_second(ctx: sv.WorkflowContext, _: Any) -> Any:
        first = unserved.execute_async(ctx, 1)
        value = first.get(ctx)  # the second may still be issued once this returns
        unserved.execute_async(ctx, 2)
        return value

    redefine("ops.left.ahead", awaits_before_the_second)
    sv.replay_instance(iid)
    sv.signal(iid, "wake")  # a dispatch of the changed code
    run_until_idle(stepper)
    assert sv.describe(iid).status == "running"
    # Once the first future's outcome exists, the changed code goes on and matches.
    run_until_idle(Worker(activity_queues=["ops-left-unserved"]))
    result = sv.get_workflow_result(iid)
    assert result.status == "completed", result.error
    assert result.output == 1


def test_an_exported_history_keeps_failing_the_check(stepper: Worker, redefine: Any) -> None:
    iid = sv.start_workflow(two_steps, instance_id="left-exported")
    run_until_idle(stepper)
    text = sv.export_history(iid).to_json()
    redefine("ops.left.two_steps", fails_at_once)
    with pytest.raises(sv.ReplayError):
        sv.replay_history(sv.parse_history(text))
    doc = json.loads(text)
    doc["events"] = []  # nothing recorded: the failure is the code's own
    sv.replay_history(sv.parse_history(json.dumps(doc)))
