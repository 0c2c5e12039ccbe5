"""The replay engine without a database: an in-memory store and runtime drive ``Execution``."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django import exceptions as exc
from selvedge_django.engine.codec import (
    Codec,
    decode_time,
    error_from_envelope,
    error_to_envelope,
)
from selvedge_django.engine.context import WorkflowContext
from selvedge_django.engine.events import Arrivals, Fence, HistoryRow
from selvedge_django.engine.execution import Execution
from selvedge_django.engine.ports import (
    ChildSpec,
    ClaimedTask,
    CloseRequest,
    ExecutionOutcome,
    ExecutionSnapshot,
    Observation,
    ObservationResult,
    ReceiveOutcome,
    SignalMessage,
    TaskSpec,
)
from tests.conftest import ROOT

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


# -- fakes ------------------------------------------------------------------------------


@dataclass
class MemoryStore:
    """An EngineStore in memory: first value wins, every call is logged."""

    rows: dict[str, HistoryRow] = field(default_factory=dict)
    tasks: dict[str, TaskSpec] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    fail_with: BaseException | None = None
    # Keys whose reservation also released the lease (execute() of a background task).
    released_by: list[str] = field(default_factory=list)

    def _write(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_with is not None:
            raise self.fail_with

    def record_command(self, fence: Fence, row: HistoryRow) -> HistoryRow:
        self._write("record_command")
        return self.rows.setdefault(row.key, dataclasses.replace(row))

    def reserve_activity(
        self,
        fence: Fence,
        row: HistoryRow,
        task: TaskSpec,
        claim_owner: str | None,
        *,
        release: bool = False,
        observe_cancel: bool = False,
    ) -> tuple[HistoryRow, ClaimedTask | None]:
        self._write("reserve_activity")
        if release:
            self.released_by.append(row.key)
        stored = self.rows.setdefault(row.key, dataclasses.replace(row))
        self.tasks.setdefault(row.key, task)
        return stored, None

    def claim_task(self, instance_id: str, key: str, owner: str) -> ClaimedTask | None:
        self.calls.append("claim_task")
        return None

    def get_row(self, instance_id: str, key: str) -> HistoryRow | None:
        self.calls.append("get_row")
        row = self.rows.get(key)
        return None if row is None else dataclasses.replace(row)

    def close(self, fence: Fence, request: CloseRequest) -> None:
        self._write("close")

    def release_lease(self, fence: Fence, runnable: bool = False) -> None:
        self._write("release_lease")

    def now_ms(self) -> int:
        return int(T0.timestamp() * 1000)

    def reserve_timer(self, fence: Fence, row: HistoryRow, expires_at: Any) -> HistoryRow:
        self._write("reserve_timer")
        return self.rows.setdefault(row.key, dataclasses.replace(row))

    def observe(self, fence: Fence, observation: Observation) -> ObservationResult:
        self._write("observe")
        row = observation.record or observation.fill
        stored = None if row is None else self.rows.setdefault(row.key, dataclasses.replace(row))
        return ObservationResult(stored, Arrivals())

    def next_signal(self, instance_id: str, channel: str) -> SignalMessage | None:
        self.calls.append("next_signal")
        return None

    def receive_next(
        self, fence: Fence, seq: int, key: str, channel: str, uncancelled: bool
    ) -> ReceiveOutcome | None:
        return None  # the engine reads, then observes

    def signal_payload(self, signal_id: int) -> str | None:
        self.calls.append("signal_payload")
        return None

    def arrivals(self, instance_id: str) -> Arrivals:
        self.calls.append("arrivals")
        return Arrivals()

    def cancel_state(self, instance_id: str) -> tuple[bool, str]:
        self.calls.append("cancel_state")
        return False, ""

    def timer_fired(self, instance_id: str, key: str) -> bool:
        self.calls.append("timer_fired")
        return False

    def start_child(self, fence: Fence, row: HistoryRow, child: ChildSpec) -> HistoryRow:
        self._write("start_child")
        return self.rows.setdefault(row.key, dataclasses.replace(row))

    @property
    def writes(self) -> list[str]:
        write_ops = (
            "record_command",
            "reserve_activity",
            "reserve_timer",
            "observe",
            "start_child",
        )
        return [c for c in self.calls if c in write_ops or c == "close"]


class FakeClock:
    """An injected workflow clock that only moves when told to."""

    def __init__(self, start: datetime = T0) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value


@dataclass
class FakeRuntime:
    """A Runtime that never runs activities inline, with an injected clock."""

    store: MemoryStore = field(default_factory=MemoryStore)
    codec: Codec = field(default_factory=Codec)
    worker_id: str = "engine-test-worker"
    clock_fn: FakeClock = field(default_factory=FakeClock)
    lease_ok: bool = True
    fired: list[str] = field(default_factory=list)

    def clock(self) -> datetime:
        return self.clock_fn()

    def lease_valid(self, fence: Fence) -> bool:
        return self.lease_ok

    def can_run_inline(self, activity_name: str, queue: str) -> bool:
        return False

    def run_attempt(self, task: ClaimedTask) -> None:  # pragma: no cover - never inline
        raise AssertionError("no inline attempts in engine tests")

    def tasks_reserved(self) -> None:
        pass

    def fire(self, hook: str, **fields: Any) -> None:
        self.fired.append(hook)


FENCE = Fence("inst-1", "engine-test-worker", 1)


def run(
    fn: Any,
    history: list[HistoryRow] | None = None,
    *,
    runtime: FakeRuntime | None = None,
    input: Any = None,
) -> tuple[ExecutionOutcome, FakeRuntime]:
    runtime = runtime or FakeRuntime()
    snapshot = ExecutionSnapshot(
        instance_id="inst-1",
        workflow_name="engine.wf",
        input=input,
        status="running",
        history=list(history or []),
    )
    execution = Execution(runtime, snapshot, FENCE)
    outcome = execution.run(fn, WorkflowContext(execution, execution.root_scope))
    return outcome, runtime


def completed(seq: int, name: str, value: Any, key: str | None = None) -> HistoryRow:
    return HistoryRow(
        key=key or f"#{seq}:{name}",
        seq=seq,
        command="activity",
        event_type="ActivityCompleted",
        data=json.dumps(value),
        reservation=json.dumps({"name": name, "queue": ""}),
        delivered_seq=seq,
    )


def failed(seq: int, name: str, error: BaseException) -> HistoryRow:
    return HistoryRow(
        key=f"#{seq}:{name}",
        seq=seq,
        command="activity",
        event_type="ActivityFailed",
        data=json.dumps(error_to_envelope(error)),
        reservation=json.dumps({"name": name, "queue": ""}),
        delivered_seq=seq,
    )


def now_row(seq: int, value: datetime) -> HistoryRow:
    return HistoryRow(
        key=f"#{seq}:now",
        seq=seq,
        command="now",
        event_type="NowRecorded",
        data=json.dumps(value.isoformat()),
    )


@sv.activity(name="engine_test.double")
def double(n: int) -> int:
    return n * 2


@sv.activity(name="engine_test.other")
def other(n: int) -> int:
    return n


# -- replay -----------------------------------------------------------------------------


def test_replay_returns_recorded_values_without_touching_the_store() -> None:
    seen: list[bool] = []

    def wf(ctx: sv.WorkflowContext, n: int) -> list[Any]:
        seen.append(ctx.is_replaying)
        a = double.execute(ctx, n)
        b = double.execute(ctx, a)
        when = ctx.now()
        return [a, b, when.isoformat()]

    history = [
        completed(1, "engine_test.double", 10),
        completed(2, "engine_test.double", 99),  # recorded values win over recomputation
        now_row(3, T0 - timedelta(days=3)),
    ]
    outcome, runtime = run(wf, history, input=5)

    assert outcome.kind == "completed", outcome.error
    assert outcome.output == [10, 99, (T0 - timedelta(days=3)).isoformat()]
    assert seen == [True]
    assert runtime.store.calls == []


def test_is_replaying_turns_false_at_the_first_unrecorded_command() -> None:
    flags: list[bool] = []

    def wf(ctx: sv.WorkflowContext, _: Any) -> None:
        flags.append(ctx.is_replaying)
        ctx.now()
        flags.append(ctx.is_replaying)
        ctx.now()
        flags.append(ctx.is_replaying)

    outcome, runtime = run(wf, [now_row(1, T0)])
    assert outcome.kind == "completed"
    assert flags == [True, False, False]
    assert runtime.store.writes == ["record_command"]


def test_replayed_failure_raises_the_rebuilt_error_in_workflow_code() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> dict[str, Any]:
        try:
            double.execute(ctx, 1)
        except sv.ApplicationError as error:
            return {"type": error.type, "message": error.message}
        return {}

    history = [failed(1, "engine_test.double", KeyError("no such account"))]
    outcome, runtime = run(wf, history)
    assert outcome.kind == "completed"
    assert outcome.output == {"type": "KeyError", "message": "'no such account'"}
    assert runtime.store.calls == []


def test_live_now_uses_the_injected_clock_and_is_recorded() -> None:
    clock = FakeClock(T0 + timedelta(hours=5))

    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        value = ctx.now()
        assert value.tzinfo is not None and value.utcoffset() == timedelta(0)
        return value.isoformat()

    outcome, runtime = run(wf, runtime=FakeRuntime(clock_fn=clock))
    assert outcome.output == (T0 + timedelta(hours=5)).isoformat()
    row = runtime.store.rows["#1:now"]
    assert (row.seq, row.command) == (1, "now")
    assert json.loads(row.data or "null") == (T0 + timedelta(hours=5)).isoformat()


@pytest.mark.parametrize(
    "data",
    [
        '"2026-11-30T09:00:00.123456+00:00"',
        '"2026-11-30T10:00:00.123456+01:00"',  # another offset: converted to UTC
        '"2026-11-30T09:00:00.123456"',  # naive: taken as UTC
        '"2026-11-30T09:00:00.123456\\u002b00:00"',  # escaped: through the JSON parser
    ],
)
def test_recorded_times_decode_to_aware_utc(data: str) -> None:
    value = decode_time(data)
    assert value == datetime(2026, 11, 30, 9, 0, 0, 123456, tzinfo=UTC)
    assert value.utcoffset() == timedelta(0)


def test_now_never_goes_below_the_recorded_floor() -> None:
    clock = FakeClock(T0)  # the live clock is behind what history already recorded

    def wf(ctx: sv.WorkflowContext, _: Any) -> list[datetime]:
        return [ctx.now(), ctx.now()]

    later = T0 + timedelta(minutes=10)
    outcome, _ = run(wf, [now_row(1, later)], runtime=FakeRuntime(clock_fn=clock))
    assert outcome.kind == "completed"
    assert outcome.output == [later, later]


def test_live_activity_is_reserved_with_resolved_options_then_suspends() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        return double.execute(
            ctx, 21, options=sv.ActivityOptions(queue="fast", start_to_close_timeout=7)
        )

    outcome, runtime = run(wf)
    assert outcome.kind == "suspended"
    assert runtime.store.writes == ["reserve_activity"]
    # execute() suspends at once: the reservation released the lease, no read came after.
    assert runtime.store.released_by == ["#1:engine_test.double"]
    assert "get_row" not in runtime.store.calls
    row = runtime.store.rows["#1:engine_test.double"]
    assert (row.seq, row.command, row.has_value) == (1, "activity", False)
    task = runtime.store.tasks["#1:engine_test.double"]
    assert task.name == "engine_test.double"
    assert task.queue == "fast"
    assert json.loads(task.input) == 21
    assert task.start_to_close_timeout == 7.0
    assert task.options["queue"] == "fast"

    # The next dispatch replays the reservation without reserving again.
    runtime.store.rows[row.key] = completed(1, "engine_test.double", 42)
    runtime.store.calls.clear()
    outcome2, _ = run(wf, list(runtime.store.rows.values()), runtime=runtime)
    assert outcome2.kind == "completed"
    assert outcome2.output == 42
    assert runtime.store.writes == []


def test_unencodable_activity_input_raises_type_error_and_writes_nothing() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        try:
            double.execute(ctx, object())
        except TypeError:
            pass
        # The position was not consumed: the next command still gets position 1.
        return ctx.now().isoformat()

    outcome, runtime = run(wf)
    assert outcome.kind == "completed", outcome.error
    assert runtime.store.writes == ["record_command"]
    assert list(runtime.store.rows) == ["#1:now"]


# -- nondeterminism ---------------------------------------------------------------------


def _assert_nondeterministic(outcome: ExecutionOutcome) -> exc.NondeterminismError:
    assert outcome.kind == "failed"
    assert isinstance(outcome.error, sv.NondeterminismError), outcome.error
    return outcome.error


def test_changed_command_at_a_recorded_position_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        return ctx.now().isoformat()  # history recorded an activity first

    outcome, runtime = run(wf, [completed(1, "engine_test.double", 2)])
    error = _assert_nondeterministic(outcome)
    assert error.key == "#1:engine_test.double"
    assert error.expected == "activity"
    assert error.actual == "now"
    assert error.instance_id == "inst-1"
    assert runtime.store.writes == []


def test_another_command_recorded_under_the_same_key_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        return double.execute(ctx, 1, activity_id="step-1")

    history = [
        HistoryRow(
            key="step-1",
            seq=1,
            command="sleep",
            event_type="TimerExpired",
            data=json.dumps(T0.isoformat()),
            delivered_seq=1,
        )
    ]
    outcome, runtime = run(wf, history)
    error = _assert_nondeterministic(outcome)
    assert (error.key, error.expected, error.actual) == ("step-1", "sleep", "activity")
    assert runtime.store.calls == []


def test_different_activity_name_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        return other.execute(ctx, 1)

    outcome, runtime = run(wf, [completed(1, "engine_test.double", 2)])
    _assert_nondeterministic(outcome)
    assert runtime.store.writes == []


def test_different_activity_name_under_the_same_activity_id_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        return other.execute(ctx, 1, activity_id="charge")

    history = [completed(1, "engine_test.double", 2, key="charge")]
    outcome, runtime = run(wf, history)
    error = _assert_nondeterministic(outcome)
    assert error.key == "charge"
    assert error.expected == "engine_test.double"
    assert error.actual == "engine_test.other"
    assert runtime.store.writes == []


def test_returning_before_recorded_commands_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        return double.execute(ctx, 1)

    history = [completed(1, "engine_test.double", 2), completed(2, "engine_test.double", 4)]
    outcome, runtime = run(wf, history)
    error = _assert_nondeterministic(outcome)
    assert error.key == "#2:engine_test.double"
    assert error.actual == "return"
    assert runtime.store.writes == []


def test_raising_before_recorded_commands_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        double.execute(ctx, 1)
        raise sv.ApplicationError("changed code gives up", type="GaveUp")

    history = [completed(1, "engine_test.double", 2), now_row(2, T0)]
    outcome, runtime = run(wf, history)
    error = _assert_nondeterministic(outcome)
    assert (error.key, error.expected, error.actual) == ("#2:now", "now", "raise")
    assert str(error) == (
        "workflow raised ApplicationError (changed code gives up) after command 1,"
        " before recorded command 2 (now '#2:now')"
    )
    assert isinstance(outcome.workflow_error, sv.ApplicationError)
    assert runtime.store.writes == []


def test_a_cancellation_before_recorded_commands_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        raise sv.ScopeCancelled()

    outcome, _ = run(wf, [completed(1, "engine_test.double", 2)])
    assert _assert_nondeterministic(outcome).actual == "cancel"


def test_failing_where_history_ends_is_the_codes_own_failure() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        double.execute(ctx, 1)  # recorded as failed: raises at position 1
        return 0

    outcome, _ = run(wf, [failed(1, "engine_test.double", ValueError("declined"))])
    assert outcome.kind == "failed"
    assert isinstance(outcome.error, sv.ApplicationError)
    assert outcome.error.message == "declined"


def test_a_sticky_failure_before_recorded_commands_is_a_divergence() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> None:
        ctx.wait_condition(lambda: 1 / 0 > 0)  # a predicate that raises fails the run

    outcome, _ = run(wf, [completed(1, "engine_test.double", 2)])
    error = _assert_nondeterministic(outcome)
    assert error.actual == "raise" and "ZeroDivisionError" in str(error)
    assert isinstance(outcome.workflow_error, ZeroDivisionError)


def test_an_abandoned_run_is_no_divergence() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        ctx.now()
        return ctx.now().isoformat()  # unrecorded: needs the lease, which is lost

    history = [now_row(1, T0), now_row(3, T0)]
    outcome, _ = run(wf, history, runtime=FakeRuntime(lease_ok=False))
    assert outcome.kind == "abandoned"
    assert isinstance(outcome.error, sv.LeaseLost)


def test_waiting_before_recorded_observations_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> Any:
        future = double.execute_async(ctx, 1)
        return future.get(ctx)  # no outcome: waits where the recorded run went on

    reserved = dataclasses.replace(
        completed(1, "engine_test.double", None), event_type="Reserved", data=None
    )
    outcome, runtime = run(wf, [reserved, now_row(2, T0)])
    error = _assert_nondeterministic(outcome)
    assert (error.key, error.actual) == ("#2:now", "wait")
    assert runtime.store.writes == []


def test_waiting_before_futures_not_yet_awaited_is_a_suspension() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> Any:
        future = double.execute_async(ctx, 1)
        return future.get(ctx)  # the recorded run issued a second future first

    def reserved(seq: int) -> HistoryRow:
        row = completed(seq, "engine_test.double", None)
        return dataclasses.replace(row, event_type="Reserved", data=None, delivered_seq=None)

    outcome, _ = run(wf, [reserved(1), reserved(2)])
    assert outcome.kind == "suspended", outcome.error


def test_catching_the_nondeterminism_error_does_not_save_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        try:
            ctx.now()
        except sv.NondeterminismError:
            pass
        return "recovered"

    outcome, runtime = run(wf, [completed(1, "engine_test.double", 2)])
    _assert_nondeterministic(outcome)
    assert runtime.store.writes == []


def _child_rows(cancel_reservation: dict[str, str] | None) -> list[HistoryRow]:
    def child(seq: int) -> HistoryRow:
        key = f"#{seq}:child:engine.kid"
        reservation = {"child_id": f"inst-1/{key}", "workflow": "engine.kid"}
        return HistoryRow(key, seq, "child", reservation=json.dumps(reservation))

    cancel = HistoryRow(
        "#3:child_cancel",
        3,
        "child_cancel",
        "ChildCancelRequested",
        "null",
        None if cancel_reservation is None else json.dumps(cancel_reservation),
        3,
    )
    return [child(1), child(2), cancel]


def _cancels_the_second(ctx: sv.WorkflowContext, _: Any) -> None:
    ctx.start_child("engine.kid")
    ctx.start_child("engine.kid").cancel(ctx)


def test_a_recorded_child_cancel_must_name_the_same_child() -> None:
    first = {"child_key": "#1:child:engine.kid", "child_id": "inst-1/#1:child:engine.kid"}
    outcome, runtime = run(_cancels_the_second, _child_rows(first))
    error = _assert_nondeterministic(outcome)
    assert error.key == "#3:child_cancel"
    assert json.loads(error.expected) == first
    assert json.loads(error.actual)["child_key"] == "#2:child:engine.kid"
    assert runtime.store.writes == []

    second = {"child_key": "#2:child:engine.kid", "child_id": "inst-1/#2:child:engine.kid"}
    outcome, _ = run(_cancels_the_second, _child_rows(second))
    assert outcome.kind == "completed", outcome.error


def test_an_older_child_cancel_record_without_its_target_stays_readable() -> None:
    outcome, _ = run(_cancels_the_second, _child_rows(None))
    assert outcome.kind == "completed", outcome.error


# -- suspension -------------------------------------------------------------------------


def test_suspension_unwinds_through_finally_and_rejects_commands_while_unwinding() -> None:
    events: list[str] = []

    class Resource:
        def __enter__(self) -> Resource:
            return self

        def __exit__(self, *exc_info: Any) -> None:
            events.append("exit")

    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        with Resource():
            try:
                return double.execute(ctx, 1)
            finally:
                events.append("finally")
                try:
                    ctx.now()  # no write while unwinding: rejected like every command
                except BaseException as error:  # the suspension is raised again
                    events.append(f"now: {type(error).__name__}")
                try:
                    double.execute_async(ctx, 2)
                except BaseException as error:
                    events.append(type(error).__name__)
                    raise

    outcome, runtime = run(wf)
    assert outcome.kind == "suspended"
    assert events == ["finally", "now: Suspend", "Suspend", "exit"]
    # Only the first reservation was written; nothing issued while unwinding was.
    assert runtime.store.writes == ["reserve_activity"]
    assert list(runtime.store.rows) == ["#1:engine_test.double"]


def test_swallowing_the_suspension_fails_the_run() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        try:
            double.execute(ctx, 1)
        except BaseException:
            pass
        return "done"

    outcome, runtime = run(wf)
    _assert_nondeterministic(outcome)
    assert runtime.store.writes == ["reserve_activity"]


def test_command_from_another_thread_fails_the_run_without_writing() -> None:
    caught: list[BaseException] = []

    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        def rogue() -> None:
            try:
                ctx.now()
            except BaseException as error:
                caught.append(error)

        thread = threading.Thread(target=rogue)
        thread.start()
        thread.join()
        return "done"

    outcome, runtime = run(wf)
    _assert_nondeterministic(outcome)
    assert len(caught) == 1 and isinstance(caught[0], sv.NondeterminismError)
    assert runtime.store.writes == []


def test_commands_after_a_lost_lease_belief_write_nothing() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        return ctx.now().isoformat()

    outcome, runtime = run(wf, runtime=FakeRuntime(lease_ok=False))
    assert outcome.kind == "abandoned"
    assert isinstance(outcome.error, sv.LeaseLost)
    assert runtime.store.calls == []


def test_a_fenced_write_abandons_the_execution() -> None:
    runtime = FakeRuntime()
    runtime.store.fail_with = sv.Fenced("another epoch owns it")

    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        try:
            ctx.now()
        except sv.Fenced:
            pass
        return "should not close"

    outcome, _ = run(wf, runtime=runtime)
    assert outcome.kind == "abandoned"
    assert isinstance(outcome.error, sv.Fenced)


# -- history keys -----------------------------------------------------------------------


@pytest.mark.parametrize("activity_id", ["$close", "#1:engine_test.double", "", "x" * 256])
def test_reserved_or_invalid_activity_ids_are_rejected(activity_id: str) -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> int:
        return double.execute(ctx, 1, activity_id=activity_id)

    outcome, runtime = run(wf)
    assert outcome.kind == "failed"
    assert isinstance(outcome.error, sv.HistoryKeyConflict)
    assert runtime.store.calls == []


def test_duplicate_activity_id_in_one_execution_is_rejected() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> str:
        double.execute_async(ctx, 1, activity_id="charge")
        try:
            double.execute_async(ctx, 2, activity_id="charge")
        except sv.HistoryKeyConflict as error:
            return f"conflict: {error.message}"
        return "no conflict"

    outcome, runtime = run(wf)
    assert outcome.kind == "completed"
    assert outcome.output.startswith("conflict")
    assert runtime.store.writes == ["reserve_activity"]
    assert list(runtime.store.rows) == ["charge"]


def test_futures_report_readiness_and_keys() -> None:
    def wf(ctx: sv.WorkflowContext, _: Any) -> list[Any]:
        first = double.execute_async(ctx, 1)
        second = double.execute_async(ctx, 2, activity_id="second")
        return [first.key, first.is_ready(), first.get(ctx), second.key, second.is_ready()]

    history = [
        completed(1, "engine_test.double", 2),
        HistoryRow(
            key="second",
            seq=2,
            command="activity",
            reservation=json.dumps({"name": "engine_test.double", "queue": ""}),
        ),
    ]
    outcome, _ = run(wf, history)
    assert outcome.kind == "completed", outcome.error
    assert outcome.output == ["#1:engine_test.double", True, 2, "second", False]


# -- error envelopes --------------------------------------------------------------------


class PaymentDeclined(Exception):
    pass


def roundtrip(error: BaseException) -> BaseException:
    return error_from_envelope(json.loads(json.dumps(error_to_envelope(error))))


def test_user_exceptions_come_back_as_application_errors() -> None:
    try:
        raise PaymentDeclined("card 4242 declined")
    except PaymentDeclined as raised:
        back = roundtrip(raised)
    assert type(back) is sv.ApplicationError
    assert back.type == f"{__name__}.PaymentDeclined"
    assert back.message == "card 4242 declined"
    assert "PaymentDeclined" in back.remote_traceback  # type: ignore[attr-defined]

    builtin = roundtrip(ValueError("bad"))
    assert isinstance(builtin, sv.ApplicationError)
    assert (builtin.type, builtin.message) == ("ValueError", "bad")


def test_application_errors_keep_type_details_and_retryability() -> None:
    back = roundtrip(
        sv.ApplicationError(
            "out of stock", type="Inventory", details={"sku": 7}, non_retryable=True
        )
    )
    assert isinstance(back, sv.ApplicationError)
    assert (back.message, back.type, back.details, back.non_retryable) == (
        "out of stock",
        "Inventory",
        {"sku": 7},
        True,
    )
    unencodable = roundtrip(sv.ApplicationError("x", details={"obj": object()}))
    assert isinstance(unencodable, sv.ApplicationError)
    assert isinstance(unencodable.details, str)


def test_a_stored_class_name_is_never_imported() -> None:
    env = {"kind": "application", "type": "os.system", "message": "boom"}
    back = error_from_envelope(env)
    assert type(back) is sv.ApplicationError
    assert back.type == "os.system"
    # An "engine" envelope naming something outside the fixed table is not trusted either.
    forged = error_from_envelope({"kind": "engine", "type": "SystemExit", "message": "bye"})
    assert type(forged) is sv.ApplicationError


def test_engine_errors_come_back_as_themselves() -> None:
    timeout = roundtrip(sv.ActivityTimeoutError("charge", "heartbeat", 3))
    assert type(timeout) is sv.ActivityTimeoutError
    assert (timeout.activity, timeout.kind, timeout.attempt) == ("charge", "heartbeat", 3)
    assert isinstance(timeout, TimeoutError)

    exhausted = roundtrip(
        sv.RetryExhaustedError("charge", 5, sv.ActivityTimeoutError("charge", "start_to_close", 5))
    )
    assert type(exhausted) is sv.RetryExhaustedError
    assert (exhausted.activity, exhausted.attempts) == ("charge", 5)
    assert type(exhausted.last_error) is sv.ActivityTimeoutError
    assert exhausted.last_error.kind == "start_to_close"

    exhausted_user = roundtrip(sv.RetryExhaustedError("charge", 2, PaymentDeclined("no")))
    assert isinstance(exhausted_user, sv.RetryExhaustedError)
    assert isinstance(exhausted_user.last_error, sv.ApplicationError)
    assert exhausted_user.last_error.type == f"{__name__}.PaymentDeclined"

    cancelled = roundtrip(sv.WorkflowCancelled("inst-9", "customer asked"))
    assert type(cancelled) is sv.WorkflowCancelled
    assert (cancelled.instance_id, cancelled.reason) == ("inst-9", "customer asked")
    assert isinstance(cancelled, sv.Cancelled) and not isinstance(cancelled, Exception)

    nd = roundtrip(sv.NondeterminismError("diverged", key="k", expected="now", actual="activity"))
    assert type(nd) is sv.NondeterminismError
    assert (nd.key, nd.expected, nd.actual, nd.message) == ("k", "now", "activity", "diverged")

    assert type(roundtrip(sv.ScopeCancelled())) is sv.ScopeCancelled
    started = roundtrip(sv.WorkflowAlreadyStarted("child-1"))
    assert type(started) is sv.WorkflowAlreadyStarted and started.instance_id == "child-1"


def test_malformed_envelopes_become_application_errors() -> None:
    back = error_from_envelope("just text")  # type: ignore[arg-type]
    assert isinstance(back, sv.ApplicationError)
    assert back.message == "just text"


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, timedelta(0), timedelta(seconds=-1)])
@pytest.mark.parametrize(
    "field_name", ["start_to_close_timeout", "schedule_to_start_timeout", "heartbeat_timeout"]
)
def test_nonpositive_or_nonfinite_timeouts_are_value_errors(field_name: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=field_name):
        sv.ActivityOptions(**{field_name: bad})


@pytest.mark.parametrize("bad", ["10", True, [1], object()])
def test_timeouts_of_the_wrong_type_are_type_errors(bad: Any) -> None:
    with pytest.raises(TypeError):
        sv.ActivityOptions(start_to_close_timeout=bad)


def test_activity_options_reject_wrong_types() -> None:
    with pytest.raises(TypeError):
        sv.ActivityOptions(queue=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sv.ActivityOptions(retry_policy={"max_attempts": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sv.ActivityOptions(queue="q" * 256)


def test_timedelta_timeouts_become_seconds() -> None:
    opts = sv.ActivityOptions(heartbeat_timeout=timedelta(minutes=2), start_to_close_timeout=1.5)
    assert opts.heartbeat_timeout == 120.0
    assert opts.start_to_close_timeout == 1.5


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_attempts": -1}, ValueError),
        ({"max_attempts": 2.0}, TypeError),
        ({"max_attempts": True}, TypeError),
        ({"initial_interval": 0}, ValueError),
        ({"initial_interval": math.nan}, ValueError),
        ({"initial_interval": "1"}, TypeError),
        ({"max_interval": -5}, ValueError),
        ({"backoff_coefficient": 0.5}, ValueError),
        ({"backoff_coefficient": math.nan}, ValueError),
        ({"backoff_coefficient": "2"}, TypeError),
        ({"initial_interval": 10, "max_interval": 5}, ValueError),
        ({"non_retryable_errors": [ValueError, "KeyError"]}, TypeError),
        ({"non_retryable_errors": "ValueError"}, TypeError),
        ({"non_retryable_errors": [int]}, TypeError),
    ],
)
def test_retry_policy_validation(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        sv.RetryPolicy(**kwargs)


def test_retry_policy_backoff() -> None:
    policy = sv.RetryPolicy(
        max_attempts=4,
        initial_interval=timedelta(seconds=2),
        backoff_coefficient=3,
        max_interval=10,
    )
    assert [policy.delay_for(n) for n in (1, 2, 3)] == [2.0, 6.0, 10.0]
    assert not policy.exhausted(3)
    assert policy.exhausted(4)
    assert not sv.RetryPolicy(max_attempts=0).exhausted(10_000)
    assert sv.RetryPolicy(non_retryable_errors=[KeyError]).non_retryable_errors == (KeyError,)


def test_per_call_non_retryable_errors_are_rejected() -> None:
    defaults = sv.ActivityOptions(retry_policy=sv.RetryPolicy(non_retryable_errors=[KeyError]))
    per_call = sv.ActivityOptions(retry_policy=sv.RetryPolicy(non_retryable_errors=[ValueError]))
    with pytest.raises(ValueError, match="non_retryable_errors"):
        defaults.merged(per_call)


def test_options_merge_field_by_field() -> None:
    policy = sv.RetryPolicy(max_attempts=3)
    defaults = sv.ActivityOptions(
        queue="default-q", start_to_close_timeout=30, heartbeat_timeout=5, retry_policy=policy
    )
    assert defaults.merged(None) == defaults
    assert defaults.merged(sv.ActivityOptions()) == defaults

    merged = defaults.merged(sv.ActivityOptions(start_to_close_timeout=60))
    assert merged.queue == "default-q"
    assert merged.start_to_close_timeout == 60.0
    assert merged.heartbeat_timeout == 5.0
    assert merged.schedule_to_start_timeout is None
    assert merged.retry_policy is policy

    other_policy = sv.RetryPolicy(max_attempts=9)
    merged = defaults.merged(
        sv.ActivityOptions(queue="fast", schedule_to_start_timeout=2, retry_policy=other_policy)
    )
    assert merged == sv.ActivityOptions(
        queue="fast",
        start_to_close_timeout=30,
        schedule_to_start_timeout=2,
        heartbeat_timeout=5,
        retry_policy=other_policy,
    )


def test_recorded_options_omit_error_classes_and_round_trip() -> None:
    opts = sv.ActivityOptions(
        queue="q",
        start_to_close_timeout=3,
        retry_policy=sv.RetryPolicy(max_attempts=2, non_retryable_errors=[KeyError]),
    )
    recorded = json.loads(json.dumps(opts.to_json()))
    assert "non_retryable_errors" not in recorded["retry_policy"]
    back = sv.ActivityOptions.from_json(recorded)
    assert back.queue == "q"
    assert back.start_to_close_timeout == 3.0
    assert back.retry_policy is not None and back.retry_policy.max_attempts == 2
    assert back.retry_policy.non_retryable_errors == ()


# -- the engine imports no Django -------------------------------------------------------


def test_engine_imports_no_django() -> None:
    code = (
        "import sys\n"
        "import importlib, pkgutil\n"
        "import selvedge_django.engine as engine\n"
        "for info in pkgutil.iter_modules(engine.__path__):\n"
        "    importlib.import_module('selvedge_django.engine.' + info.name)\n"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "print(','.join(bad))\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_engine_modules_import_only_modules_below_them() -> None:
    """Each engine module imports only modules earlier in ``engine.ORDER`` (no cycle).

    Imports under ``if TYPE_CHECKING:`` and inside functions count too: an arrow
    that needs hiding is an arrow against the order.
    """
    import ast

    from selvedge_django import engine

    folder = ROOT / "selvedge_django" / "engine"
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert sorted(engine.ORDER) == modules, "engine.ORDER must list every engine module"
    rank = {name: index for index, name in enumerate(engine.ORDER)}
    against = []
    for name in modules:
        tree = ast.parse((folder / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module] if node.module else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                prefix = "selvedge_django.engine."
                if not node.module.startswith(prefix):
                    continue
                targets = [node.module[len(prefix) :]]
            else:
                continue
            for target in targets:
                target = target.split(".")[0]
                if rank[target] >= rank[name]:
                    against.append(f"{name} imports {target}")
    assert against == []
