"""Workflow commands: each takes a command position, replays or writes one step.

Every function here runs on the workflow thread. A recorded key returns the
recorded outcome without I/O; a live command writes through the store in one
fenced transaction (see :meth:`Execution.guarded`).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, NoReturn

from .. import exceptions as exc
from .attributes import check_attributes, encode_attributes
from .codec import contains_nul, decode_time
from .durations import MAX_DURATION_SECONDS, execution_timeout_ms, to_seconds
from .events import (
    CMD_ACTIVITY,
    CMD_ATTRIBUTES,
    CMD_AWAIT,
    CMD_CANCEL_SCOPE,
    CMD_CHILD,
    CMD_NOW,
    CMD_SLEEP,
    EV_ACTIVITY_CANCELLED,
    EV_ATTRIBUTES_SET,
    EV_AWAIT_CANCELLED,
    EV_AWAIT_COMPLETED,
    EV_CHILD_CANCELLED,
    EV_CHILD_START_FAILED,
    EV_NOW_RECORDED,
    EV_SCOPE_CANCELLED,
    EV_TIMER_CANCELLED,
    EV_TIMER_EXPIRED,
    HistoryRow,
    SignalPosition,
    error_data,
    reservation_of,
)
from .execution import Execution
from .handles import ChildHandle, Future, Timer, decode_outcome
from .identifiers import check_instance_id, check_workflow_name
from .options import ActivityOptions
from .ports import ChildSpec, Observation, TaskSpec
from .scope import Scope

__all__ = [
    "activity_task",
    "cancel_scope",
    "continue_as_new",
    "default_child_id",
    "issue_activity",
    "new_timer",
    "now",
    "set_attributes",
    "start_child",
    "wait_condition",
]


# -- activities --------------------------------------------------------------------------


def issue_activity(
    execution: Execution,
    scope: Scope,
    activity: Any,
    input: Any,
    options: ActivityOptions | None,
    activity_id: str | None,
    *,
    inline: bool,
) -> Future:
    """Reserve an activity task (claimed inline when ``inline``) and return its Future."""
    execution.check_command()
    resolved = activity.options.merged(options)
    if activity_id is not None:
        execution.validate_user_key(activity_id, "activity_id")
    # Encoded in read-only replays too: workflow code that handles the error must see it
    # there as it did live, or the replay diverges.
    try:
        input_text = execution.runtime.codec.encode(input, f"input of activity {activity.name!r}")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep):
        raise
    except (TypeError, ValueError) as error:
        raise TypeError(f"activity {activity.name!r} input is not JSON: {error}") from error
    seq, key = execution.next_position(activity_id, CMD_ACTIVITY, activity.name)
    scope.commands.append((key, CMD_ACTIVITY, ""))
    future: Future[Any] = Future(
        execution, scope, key, activity.name, getattr(activity, "fn", None)
    )
    recorded = execution.history.get(key)
    if recorded is not None:
        reserved_name = reservation_of(recorded).get("name")
        if reserved_name is not None and reserved_name != activity.name:
            raise execution.nondeterminism(
                f"key {key!r} recorded activity {reserved_name!r}, code issued {activity.name!r}",
                key=key,
                expected=str(reserved_name),
                actual=activity.name,
            )
        return future
    if execution.readonly:
        raise execution.suspend(f"activity {key!r} is not recorded")
    assert input_text is not None
    reservation, spec = activity_task(activity.name, execution.workflow_name, input_text, resolved)
    concurrency = spec.concurrency
    if scope.locally_cancelled():
        execution.record(
            HistoryRow(
                key,
                seq,
                CMD_ACTIVITY,
                EV_ACTIVITY_CANCELLED,
                error_data(exc.ScopeCancelled()),
                reservation,
                seq,
            )
        )
        return future
    row = HistoryRow(key=key, seq=seq, command=CMD_ACTIVITY, reservation=reservation)
    runtime = execution.runtime
    # A task under a concurrency limit is claimed only by the claim statement, which
    # counts the attempts of its key.
    claim_owner = (
        runtime.worker_id
        if inline and concurrency is None and runtime.can_run_inline(activity.name, resolved.queue)
        else None
    )
    fence = execution.fence
    assert fence is not None
    # execute() of an activity this worker cannot run: get() follows at once and can only
    # suspend, so the reservation also releases the lease and get() reads nothing. No
    # outcome can be stored yet but by a completion racing this line, and a completion or
    # cancel request arriving from now on marks the instance runnable (kept so by the
    # release): the next execution sees either. A cancellation already known at lease
    # time takes the usual path (a locally cancelled scope returned above).
    release = inline and claim_owner is None and not execution.snapshot.cancel_requested
    # An inline claim is the start of get(), which observes the issuing scope's
    # cancellation first: in an attached scope the reservation claims only while no
    # cancel request is recorded (checked in its own fenced write), and after one it
    # records the cancellation get() would observe.
    observe_cancel = claim_owner is not None and scope.attached()
    stored, claimed = execution.guarded(
        lambda: runtime.store.reserve_activity(
            fence, row, spec, claim_owner, release=release, observe_cancel=observe_cancel
        )
    )
    if release:
        execution.released = True
    execution.check_stored(key, stored, CMD_ACTIVITY)
    if claimed is None:
        runtime.tasks_reserved()
    future._claimed = claimed
    return future


def activity_task(
    name: str, workflow_name: str, input_text: str, resolved: ActivityOptions
) -> tuple[str, TaskSpec]:
    """The reservation (JSON text) and the task of an activity issued with ``resolved``
    options: what a live ``execute()`` records, and what a start that records its
    workflow's first activity itself writes (``start_with_activity``)."""
    policy = resolved.effective_retry_policy()
    spec = TaskSpec(
        name=name,
        workflow_name=workflow_name,
        input=input_text,
        queue=resolved.queue,
        options=resolved.to_json(),
        max_attempts=policy.max_attempts,
        schedule_to_start_timeout=_float(resolved.schedule_to_start_timeout),
        start_to_close_timeout=_float(resolved.start_to_close_timeout),
        heartbeat_timeout=_float(resolved.heartbeat_timeout),
        priority=resolved.effective_priority,
        concurrency=resolved.concurrency_limit(name),
    )
    return json.dumps({"name": name, "queue": resolved.queue}), spec


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


# -- time and timers ---------------------------------------------------------------------


def now(execution: Execution) -> datetime:
    """Record (live) or return (replay) one workflow-time observation.

    While the execution unwinds (a suspension is on its way out through ``finally``
    blocks) ``now()`` is rejected like every other command, without a write: the
    suspension is raised again. The seeds' ``Now`` returns the floor together with an
    error there; a Python call cannot do both, and the error is what matters: the
    call records nothing.
    """
    execution.check_command("now()")
    seq, key = execution.next_position(None, CMD_NOW, "now")
    recorded = execution.history.get(key)
    if recorded is not None and recorded.data is not None:
        value = decode_time(recorded.data)
        execution.advance_floor(value)
        return value
    if execution.readonly:
        raise execution.suspend("now() is not recorded")
    live = execution.time_base()
    stored = execution.record(
        HistoryRow(key, seq, CMD_NOW, EV_NOW_RECORDED, json.dumps(live.isoformat()))
    )
    value = decode_time(stored.data or json.dumps(live.isoformat()))
    execution.advance_floor(value)
    return value


def new_timer(
    execution: Execution,
    scope: Scope,
    duration: float | timedelta | None,
    sleep_id: str | None,
    *,
    until: datetime | None = None,
) -> Timer:
    """Issue a sleep command: arm a durable timer (or record an immediate expiry)."""
    execution.check_command()
    if until is not None:
        if not isinstance(until, datetime):
            raise TypeError(f"sleep_until() needs a datetime, not {until!r}")
        if until.tzinfo is None:
            raise ValueError("sleep_until() needs an aware datetime")
        if (until - execution.time_base()).total_seconds() > MAX_DURATION_SECONDS:
            raise ValueError(
                f"sleep_until() must be at most 100 years ahead, not {until.isoformat()}"
            )
        seconds = None
    else:
        seconds = to_seconds(duration, "sleep duration", allow_nonpositive=True)
    if sleep_id is not None:
        execution.validate_user_key(sleep_id, "sleep_id")
    seq, key = execution.next_position(sleep_id, CMD_SLEEP, "sleep")
    scope.commands.append((key, CMD_SLEEP, ""))
    timer = Timer(execution, scope, key)
    if key in execution.history:
        return timer
    if execution.readonly:
        raise execution.suspend(f"timer {key!r} is not recorded")
    if scope.locally_cancelled():
        execution.record(
            HistoryRow(
                key, seq, CMD_SLEEP, EV_TIMER_CANCELLED, error_data(exc.ScopeCancelled()), None, seq
            )
        )
        return timer
    base = execution.time_base()
    if until is not None:
        seconds = (until - base).total_seconds()
    assert seconds is not None
    expires = base + timedelta(seconds=max(0.0, seconds))
    reservation = json.dumps({"expires_at": expires.isoformat()})
    if seconds <= 0:
        execution.record(
            HistoryRow(
                key,
                seq,
                CMD_SLEEP,
                EV_TIMER_EXPIRED,
                json.dumps(expires.isoformat()),
                reservation,
                seq,
            )
        )
        return timer
    fence = execution.fence
    assert fence is not None
    store = execution.runtime.store
    row = HistoryRow(key, seq, CMD_SLEEP, reservation=reservation)
    delay = (expires - base).total_seconds()
    stored = execution.guarded(lambda: store.reserve_timer(fence, row, expires, delay))
    execution.check_stored(key, stored, CMD_SLEEP)
    return timer


# -- conditions --------------------------------------------------------------------------


def _evaluate(execution: Execution, predicate: Any) -> bool:
    with execution.evaluating_predicate():
        try:
            return bool(predicate())
        except exc.NondeterminismError:
            raise
        except BaseException as error:
            if execution.suspension is not None:
                raise
            raise execution.fail(error) from error


def wait_condition(execution: Execution, scope: Scope, predicate: Any) -> None:
    """Wait until ``predicate`` is true in the delivered view; deliver what it saw."""
    execution.check_command()
    if predicate is None or not callable(predicate):
        raise execution.fail(TypeError("wait_condition() needs a callable predicate"))
    if _evaluate(execution, predicate):
        return
    seq, key = execution.next_position(None, CMD_AWAIT, "await")
    recorded = execution.history.get(key)
    if recorded is not None and recorded.has_value:
        if recorded.event_type == EV_AWAIT_COMPLETED:
            return
        decode_outcome(recorded, execution)
        return
    if execution.readonly:
        raise execution.suspend("condition not met in recorded history")
    store = execution.runtime.store
    while True:  # again after each wait the worker's cache continues (Execution.wait_here)
        arrivals = execution.guarded(lambda: store.arrivals(execution.instance_id))
        for arrived_key in arrivals.keys:
            execution.refresh(arrived_key)
        for signal_id, channel in arrivals.signals:
            execution.signals.setdefault(signal_id, SignalPosition(signal_id, channel))
        with execution.with_candidates(arrivals):
            satisfied = _evaluate(execution, predicate)
        if satisfied:
            execution.observe(
                Observation(
                    seq,
                    record=HistoryRow(key, seq, CMD_AWAIT, EV_AWAIT_COMPLETED, json.dumps(None)),
                    deliver=arrivals,
                )
            )
            return
        cancelled = execution.cancellation(scope)
        if cancelled is not None:
            execution.observe(
                Observation(
                    seq,
                    record=HistoryRow(
                        key, seq, CMD_AWAIT, EV_AWAIT_CANCELLED, error_data(cancelled)
                    ),
                    deliver_all=True,
                )
            )
            raise cancelled
        execution.wait_here("condition not met")


# -- children ----------------------------------------------------------------------------


def default_child_id(execution: Execution, key: str) -> str:
    """The id of a child started without one: the parent's id and the command key.

    A history a continue-as-new opened (its ``history_generation`` above 1) numbers
    its commands from 1 again, so its default ids also name that generation:
    ``<parent>/gen-<n>/<key>``. The first history keeps ``<parent>/<key>``, so ids
    of instances started before continue-as-new existed do not change, and a resume
    (which keeps the history's generation) starts its children under the same ids.
    """
    generation = execution.snapshot.history_generation
    prefix = (
        execution.instance_id if generation <= 1 else f"{execution.instance_id}/gen-{generation}"
    )
    return check_instance_id(f"{prefix}/{key}", "child id (the parent's id and the command key)")


def start_child(
    execution: Execution,
    scope: Scope,
    workflow_or_name: Any,
    input: Any,
    child_id: str | None,
    execution_timeout: Any = None,
) -> ChildHandle:
    """Create a child instance and the parent's command in one transaction."""
    execution.check_command()
    name = check_workflow_name(getattr(workflow_or_name, "name", workflow_or_name))
    if child_id is not None:
        check_instance_id(child_id, "child id")
    timeout_ms = execution_timeout_ms(execution_timeout, "child execution_timeout")
    # Encoded in read-only replays too (see issue_activity).
    try:
        input_text = execution.runtime.codec.encode(input, "child input")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
        raise exc.WorkflowStartRejected(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.WorkflowStartRejected(f"child input is not JSON-encodable: {error}") from error
    if contains_nul(input_text):
        raise exc.WorkflowStartRejected("child input contains a NUL character (\\u0000)")
    input_value: Any = json.loads(input_text)
    seq, key = execution.next_position(None, CMD_CHILD, f"child:{name}")
    recorded = execution.history.get(key)
    reserved = reservation_of(recorded)
    instance = child_id or default_child_id(execution, key)
    if (
        child_id is None
        and isinstance(reserved.get("child_id"), str)
        and reserved.get("workflow", name) == name
    ):
        # A default id comes from where the step was first recorded: a fork's copy of
        # the row names the source's child, and the recorded id is the child it got.
        instance = reserved["child_id"]
    scope.commands.append((key, CMD_CHILD, instance))
    handle: ChildHandle[Any] = ChildHandle(
        execution, scope, key, instance, getattr(workflow_or_name, "fn", None)
    )
    if recorded is not None:
        if reserved.get("child_id", instance) != instance or reserved.get("workflow", name) != name:
            raise execution.nondeterminism(
                f"child {key!r} recorded {reserved}, code started {name!r} as {instance!r}",
                key=key,
                expected=json.dumps(reserved),
                actual=instance,
            )
        if recorded.event_type == EV_CHILD_START_FAILED:
            raise decode_outcome(recorded, execution, raise_it=False)
        return handle
    if execution.readonly:
        raise execution.suspend(f"child {key!r} is not recorded")
    reservation = json.dumps({"child_id": instance, "workflow": name})
    if scope.locally_cancelled():
        execution.record(
            HistoryRow(
                key,
                seq,
                CMD_CHILD,
                EV_CHILD_CANCELLED,
                error_data(exc.ScopeCancelled()),
                reservation,
                seq,
            )
        )
        return handle
    fence = execution.fence
    assert fence is not None
    store = execution.runtime.store
    row = HistoryRow(key, seq, CMD_CHILD, reservation=reservation)
    stored = execution.guarded(
        lambda: store.start_child(
            fence,
            row,
            ChildSpec(
                instance,
                name,
                input_value,
                timeout_ms,
                parent_generation=execution.snapshot.history_generation,
            ),
        )
    )
    execution.check_stored(key, stored, CMD_CHILD)
    if stored.event_type == EV_CHILD_START_FAILED:
        raise decode_outcome(stored, execution, raise_it=False)
    execution.runtime.fire("on_workflow_started", instance_id=instance, workflow_name=name)
    return handle


# -- search attributes -------------------------------------------------------------------


def set_attributes(execution: Execution, attributes: object) -> None:
    """Record (live) or pass over (replay) one change of the instance's search attributes.

    A bad name or value raises ``ValueError`` before a command position is taken, so
    workflow code may catch it and its history stays aligned. Live, the command row
    and the attribute rows commit in one fenced transaction; in replay the recorded
    row is enough and nothing is written (the rows it changed are already there).
    The recorded values are not compared with the code's: a later deployment may
    set other values, which the next live call writes.
    """
    execution.check_command("set_attributes()")
    checked = check_attributes(attributes)
    seq, key = execution.next_position(None, CMD_ATTRIBUTES, "attributes")
    if key in execution.history:
        return
    if execution.readonly:
        raise execution.suspend(f"set_attributes {key!r} is not recorded")
    fence = execution.fence
    assert fence is not None
    store = execution.runtime.store
    # Delivered at its own position, as a patch marker: no arrival for a later wait.
    row = HistoryRow(
        key, seq, CMD_ATTRIBUTES, EV_ATTRIBUTES_SET, encode_attributes(checked), None, seq
    )
    stored = execution.guarded(lambda: store.set_attributes(fence, row, checked))
    execution.check_stored(key, stored, CMD_ATTRIBUTES)


# -- continue-as-new ---------------------------------------------------------------------


def continue_as_new(execution: Execution, input: Any) -> NoReturn:
    """End this generation and start a fresh history with ``input`` (raises, never returns).

    The input is encoded at once, so a value that cannot be stored raises
    :class:`WorkflowStartRejected` in the workflow code, and nothing is written. A
    read-only replay (a replay check, a query) stops here as at its frontier: the
    generation that continued is archived, so no current history records it.
    """
    execution.check_command("continue_as_new")
    try:
        text = execution.runtime.codec.encode(input, "continue-as-new input")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
        raise exc.WorkflowStartRejected(str(error)) from error
    except (TypeError, ValueError) as error:
        raise exc.WorkflowStartRejected(
            f"continue-as-new input is not JSON-encodable: {error}"
        ) from error
    if contains_nul(text):
        raise exc.WorkflowStartRejected("continue-as-new input contains a NUL character (\\u0000)")
    if execution.readonly:
        raise execution.suspend("continue-as-new ends the recorded generation")
    raise execution.continue_as_new(text)


# -- scope cancellation ------------------------------------------------------------------

_CANCELLED_EVENT = {
    CMD_ACTIVITY: EV_ACTIVITY_CANCELLED,
    CMD_SLEEP: EV_TIMER_CANCELLED,
    CMD_CHILD: EV_CHILD_CANCELLED,
}


def cancel_scope(execution: Execution, scope: Scope) -> None:
    """Cancel a scope: one record, one fenced transaction; repeats write nothing."""
    execution.check_command("cancel()")
    if scope.locally_cancelled():
        return
    targets: list[dict[str, str]] = []
    for member in scope.subtree():
        for key, command, child in member.commands:
            if command in (CMD_ACTIVITY, CMD_SLEEP, CMD_CHILD):
                if execution.visible(key):
                    continue
                target = {"key": key, "command": command}
                if child:
                    target["child_id"] = child
                targets.append(target)
    seq, key = execution.next_position(None, CMD_CANCEL_SCOPE, "cancel_scope")
    recorded = execution.history.get(key)
    if recorded is not None:
        reserved = reservation_of(recorded).get("targets")
        if reserved is not None and reserved != targets:
            raise execution.nondeterminism(
                f"cancel_scope {key!r} recorded targets {reserved}, code cancelled {targets}",
                key=key,
                expected=json.dumps(reserved),
                actual=json.dumps(targets),
            )
        scope.cancelled = True
        return
    if execution.readonly:
        raise execution.suspend(f"cancel_scope {key!r} is not recorded")
    data = error_data(exc.ScopeCancelled())
    execution.observe(
        Observation(
            seq,
            record=HistoryRow(
                key,
                seq,
                CMD_CANCEL_SCOPE,
                EV_SCOPE_CANCELLED,
                json.dumps(None),
                json.dumps({"targets": targets}),
                seq,
            ),
            fill_cancelled=tuple((t["key"], _CANCELLED_EVENT[t["command"]], data) for t in targets),
            cancel_tasks=tuple(t["key"] for t in targets if t["command"] != CMD_CHILD),
            cancel_children=tuple(
                (t["child_id"], t["key"]) for t in targets if t["command"] == CMD_CHILD
            ),
            cancel_reason="scope cancelled by parent",
        )
    )
    scope.cancelled = True
