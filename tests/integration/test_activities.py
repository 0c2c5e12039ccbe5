"""Activities at full strength: futures, recorded options, retries, timeouts, heartbeats,
attempt numbers, queues, the leader and transactional activities.

Everything runs against the real test database (SQLite or PostgreSQL, see
``SELVEDGE_TEST_DB``). Where waiting would be slow (backoff, schedule-to-start
timeouts, lapsed claims and leader leases) a ``ControllableClock`` moves
workflow time and the database clock together, and an unstarted ``Worker`` is
driven step by step with ``run_until_idle`` (its leader with
``worker.leader.run_once()``). Short attempt deadlines and heartbeat timeouts
run on real worker threads, since they are measured on the attempt's own
monotonic clock.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.engine.activity import ActivityInfo, AttemptState, attempt_scope
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.events import HistoryRow
from selvedge_django.engine.ports import TaskSpec
from selvedge_django.hooks import HookEvent, WorkflowHooks
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.storage import store_for
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from selvedge_django.worker.leader import LEADER_LOCK
from tests.conftest import wait_until
from tests.testapp.models import Ledger
from tests.testapp.workflows import activities as wf

SHORT_LEASE = {"TTL": 1.5, "RENEW_INTERVAL": 0.3, "MARGIN": 0.3, "MAX_SKEW": 0.1}
FAST_RETRY = {"initial_interval": 0.05, "backoff_coefficient": 1.0, "max_interval": 0.05}


# -- helpers ----------------------------------------------------------------------------


def start(
    activity: str,
    input: dict[str, Any],
    options: dict[str, Any] | None = None,
    **flags: Any,
) -> str:
    """Start ``act.run``, one activity with per-call options (testapp/workflows/activities.py)."""
    data: dict[str, Any] = {"activity": activity, "input": input, **flags}
    if options is not None:
        data["options"] = options
    return sv.start_workflow("act.run", data)


def ledger(prefix: str) -> list[str]:
    return sorted(Ledger.objects.filter(entry__startswith=prefix).values_list("entry", flat=True))


def task_of(instance_id: str) -> ActivityTask:
    (task,) = ActivityTask.objects.filter(instance_id=instance_id, name__startswith="act.")
    return task


def history(instance_id: str, key: str) -> HistoryEvent:
    return HistoryEvent.objects.get(instance_id=instance_id, key=key)


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def db_now_ms() -> int:
    return store_for("default", Codec()).now_ms()


def observe(seconds: float, check: Callable[[], None], interval: float = 0.05) -> int:
    """Run ``check`` repeatedly for ``seconds`` (a window for a safety property)."""
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        check()
        rounds += 1
        time.sleep(interval)
    check()
    return rounds + 1


def drive(clock: ControllableClock, **overrides: Any) -> int:
    """Run a fresh, unstarted Worker (a new process, in effect) until nothing is runnable."""
    return run_until_idle(Worker(clock=clock, **overrides))


def sweep(clock: ControllableClock, **overrides: Any) -> int:
    """Run one round of leader duties on a fresh worker; return tasks it changed."""
    worker = Worker(clock=clock, **overrides)
    before = list(ActivityTask.objects.values_list("id", "status", "failures"))
    worker.leader.run_once()
    assert worker.leader.is_leader
    worker.leader.resign()
    after = list(ActivityTask.objects.values_list("id", "status", "failures"))
    return len(set(after) - set(before))


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A file that holding activities wait on; removed after the test whatever happens."""
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def scratch() -> Iterator[Callable[[str, str], None]]:
    """Unregister throwaway workflows and activities defined by a test, before and after."""
    names: list[tuple[str, str]] = []

    def forget(name: str, kind: str) -> None:
        registry.unregister(name, kind=kind)
        names.append((name, kind))

    yield forget
    for name, kind in names:
        registry.unregister(name, kind=kind)


# -- 1. futures and background activity workers -----------------------------------------


def test_futures_reserve_in_issue_order_and_run_concurrently(worker: Any) -> None:
    instance_id = sv.start_workflow("act.fan_out", {"n": 4, "tag": "fan"})
    result = sv.wait_workflow(instance_id, timeout=20)

    # Each act.rendezvous waits until all four have started: run one by one, they fail.
    assert result.status == "completed", result.error
    assert result.output["values"] == [0, 1, 2, 3]
    rows = list(
        HistoryEvent.objects.filter(instance_id=instance_id, command="activity").order_by("seq")
    )
    assert [r.seq for r in rows] == [1, 2, 3, 4]
    assert [r.key for r in rows] == result.output["keys"]  # fixed at issue time
    assert [json.loads(r.data) for r in rows] == [0, 1, 2, 3]
    tasks = sv.list_activity_tasks(instance_id)
    assert [(t.key, t.seq, t.status, t.attempts) for t in tasks] == [
        (r.key, r.seq, "completed", 1) for r in rows
    ]


def test_background_attempts_are_bounded_by_max_concurrent_activities(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    make_worker(max_concurrent_activities=2)
    hold = {"hold_while": str(marker), "mode": "heartbeat"}
    instance_id = sv.start_workflow("act.all_ready", {"n": 5, "tag": "cap", "input": hold})
    tasks = ActivityTask.objects.filter(instance_id=instance_id)
    wait_until(lambda: tasks.count() == 5 and len(ledger("wait:cap")) == 2)

    def two_at_most() -> None:
        assert tasks.filter(status="running").count() == 2
        assert tasks.filter(status="queued").count() == 3
        assert len(ledger("wait:cap")) == 2

    observe(0.6, two_at_most)
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == [f"cap{i}:1" for i in range(5)]
    assert {t.attempts for t in sv.list_activity_tasks(instance_id)} == {1}


def test_new_tasks_wake_local_activity_workers_at_once(make_worker: Callable[..., Any]) -> None:
    # Polls every 30 s at best: only the in-process wake-up can start the task sooner.
    make_worker(activity_poll_interval=30, max_poll_interval=60)
    no_hold = {"hold_while": "/nonexistent/selvedge", "mode": "heartbeat"}
    first = sv.start_workflow("act.all_ready", {"n": 1, "tag": "wake-a", "input": no_hold})
    assert sv.wait_workflow(first, timeout=20).status == "completed"

    started = time.monotonic()
    second = sv.start_workflow("act.all_ready", {"n": 1, "tag": "wake-b", "input": no_hold})
    result = sv.wait_workflow(second, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == ["wake-b0:1"]
    assert time.monotonic() - started < 10


def test_idle_activity_polling_backs_off(tdb: None, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = Worker(activity_poll_interval=0.05, max_poll_interval=0.4)
    polls: list[float] = []
    claim_tasks = worker.store.tasks.claim_tasks

    def counting(*args: Any, **kwargs: Any) -> Any:
        polls.append(time.monotonic())
        return claim_tasks(*args, **kwargs)

    monkeypatch.setattr(worker.store.tasks, "claim_tasks", counting)
    worker.start()
    try:
        time.sleep(1.6)  # an observation window, not a synchronisation
    finally:
        worker.stop(timeout=5)
    # Without backoff: ~32 polls at 0.05 s. With it: 0.05, 0.1, 0.2, then 0.4 s apart.
    assert 3 <= len(polls) <= 12, polls
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    assert max(gaps) > 0.25


def test_get_runs_a_claimable_task_inline(clock: ControllableClock) -> None:
    instance_id = start("act.step", {"tag": "inl"}, **{"async": True})
    worker = Worker(clock=clock)
    worker.resumptions.inline = True
    worker.activities.inline = True

    # One dispatch: the execution reserves the task, get() claims and runs it on the
    # workflow thread, and the workflow closes; no activity worker was involved.
    assert worker.dispatcher.run_once() == 1

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output["attempt"] == 1
    task = task_of(instance_id)
    assert (task.status, task.attempts, task.claim_owner) == ("completed", 1, worker.worker_id)
    assert instance(instance_id).lease_epoch == 1


def test_get_suspends_while_another_worker_holds_the_task(clock: ControllableClock) -> None:
    instance_id = start("act.step", {"tag": "held"}, **{"async": True})
    assert drive(clock, activity_queues=[]) == 1  # reserved; nobody here serves its queue
    store = store_for("default", Codec())
    (other,) = store.tasks.claim_tasks("other-worker", 10, ["act.step"])

    # A signal wakes the instance on a worker that serves every queue: get() finds the
    # task held by the other worker and yields again.
    sv.signal(instance_id, "poke")
    assert drive(clock) == 1
    inst = instance(instance_id)
    assert (inst.status, inst.lease_owner, inst.runnable) == ("running", "", False)
    assert history(instance_id, other.claim.key).data is None

    assert store.tasks.complete_task(other.claim, json.dumps("from the other worker"))
    assert drive(clock) == 1

    result = sv.get_workflow_result(instance_id)
    assert (result.status, result.output) == ("completed", "from the other worker")
    assert ledger("step:held") == []  # the body never ran here
    assert task_of(instance_id).attempts == 1


def test_execute_of_a_task_for_another_worker_releases_the_lease_in_its_reservation(
    clock: ControllableClock,
) -> None:
    instance_id = start("act.step", {"tag": "away"})
    worker = Worker(clock=clock, activity_queues=[])
    worker.resumptions.inline = True
    with CaptureQueriesContext(connection) as captured:
        assert worker.dispatcher.run_once() == 1

    # The reservation was the execution's last statement: it also gave the lease up,
    # with no release at suspension and no read of the new row or the cancel request.
    sqls = [q["sql"] for q in captured.captured_queries]
    reservation = max(i for i, sql in enumerate(sqls) if "INSERT INTO" in sql and "task" in sql)
    assert [sql for sql in sqls[reservation + 1 :] if sql != "COMMIT"] == []
    inst = instance(instance_id)
    assert (inst.lease_owner, inst.lease_expires_ms, inst.runnable) == ("", None, False)
    assert (inst.lease_epoch, task_of(instance_id).status) == (1, "queued")

    drive(clock)  # runs the task; its completion wakes the instance
    result = sv.get_workflow_result(instance_id)
    assert (result.status, result.output["attempt"]) == ("completed", 1)


def test_input_arriving_during_an_execution_that_released_in_its_reservation_wakes_it(
    clock: ControllableClock,
) -> None:
    instance_id = sv.start_workflow("act.poked_then_away", {"tag": "poked"})
    worker = Worker(clock=clock, activity_queues=[""])
    worker.resumptions.inline = True
    worker.activities.inline = True
    assert worker.dispatcher.run_once() == 1

    # The signal arrived while the lease was held: released by the reservation, the
    # instance stays runnable, and the next dispatch takes it again.
    inst = instance(instance_id)
    assert (inst.lease_owner, inst.runnable, inst.lease_epoch) == ("", True, 1)
    away = ActivityTask.objects.get(instance_id=instance_id, name="act.step")
    assert away.status == "queued"
    assert worker.dispatcher.run_once() == 1
    assert instance(instance_id).lease_epoch == 2


def test_swallowing_the_suspension_of_a_background_execute_abandons_the_execution(
    clock: ControllableClock, caplog: pytest.LogCaptureFixture
) -> None:
    instance_id = sv.start_workflow("act.swallow_away", {"tag": "swallow"})
    worker = Worker(clock=clock, activity_queues=[])
    worker.resumptions.inline = True
    with caplog.at_level("WARNING", logger="selvedge_django"):
        assert worker.dispatcher.run_once() == 1

    # The lease went with the reservation: nothing was closed, nothing is held.
    assert "swallowed the suspension" in caplog.text
    inst = instance(instance_id)
    assert (inst.status, inst.lease_owner, inst.runnable) == ("running", "", False)
    assert task_of(instance_id).status == "queued"
    drive(clock)  # the activity completes; the replay finds its value and goes on
    result = sv.get_workflow_result(instance_id)
    assert (result.status, result.output) == ("completed", "swallowed")


def test_completing_without_awaiting_a_future_cancels_its_task(
    make_worker: Callable[..., Any],
) -> None:
    make_worker(activity_queues=["only-this-one"])
    instance_id = sv.start_workflow("act.forget", {"tag": "forgotten"})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    row = history(instance_id, result.output)
    assert row.event_type == "ActivityCancelled"
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.key, task.status, task.attempts, task.queue) == (
        result.output,
        "cancelled",
        0,
        "act-unserved",
    )
    assert ledger("step:forgotten") == []


# -- 2. options recorded at reservation -------------------------------------------------


def test_definition_defaults_and_call_overrides_are_resolved_field_by_field(
    worker: Any,
) -> None:
    overrides = {"start_to_close_timeout": 5, "retry_policy": {"max_attempts": 2}}
    instance_id = start("act.defaults", {"tag": "opt"}, overrides)
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    expected = {
        "queue": "act-defaults",  # definition
        "start_to_close_timeout": 5.0,  # call
        "schedule_to_start_timeout": 60.0,  # definition
        "heartbeat_timeout": 10.0,  # definition
        # The call's policy replaces the definition's as one field, error classes excluded.
        "retry_policy": {
            "max_attempts": 2,
            "initial_interval": 1.0,
            "backoff_coefficient": 2.0,
            "max_interval": 60.0,
        },
    }
    assert result.output == {"attempt": 1, "options": expected}  # activity_info().options
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.name, info.queue, info.status, info.options.to_json()) == (
        "act.defaults",
        "act-defaults",
        "completed",
        expected,
    )
    # Both are ActivityOptions with a RetryPolicy, as recorded (no error classes).
    recorded = sv.ActivityOptions(
        queue="act-defaults",
        start_to_close_timeout=5,
        schedule_to_start_timeout=60,
        heartbeat_timeout=10,
        retry_policy=sv.RetryPolicy(max_attempts=2),
    )
    assert info.options == recorded
    assert info.options.retry_policy is not None
    assert info.options.retry_policy.max_attempts == 2
    task = task_of(instance_id)
    assert (task.max_attempts, task.start_to_close_ms, task.schedule_to_start_ms) == (
        2,
        5000,
        60000,
    )
    assert task.heartbeat_timeout_ms == 10000


def test_recorded_options_outlive_code_changes(
    clock: ControllableClock, scratch: Callable[[str, str], None]
) -> None:
    scratch("act.scratch.changing", "activity")
    scratch("act.scratch.changing_flow", "workflow")

    def body(data: Any) -> Any:
        info = sv.activity_info()
        assert info is not None
        Ledger.objects.create(entry=f"changing:{info.attempt}")
        raise wf.StepError(f"attempt {info.attempt}")

    old = sv.activity(
        name="act.scratch.changing",
        queue="changing-q",
        start_to_close_timeout=30,
        retry_policy=sv.RetryPolicy(max_attempts=2, initial_interval=5, max_interval=5),
    )(body)

    @sv.workflow(name="act.scratch.changing_flow")
    def flow(ctx: sv.WorkflowContext, _: Any) -> Any:
        return registry.get_activity("act.scratch.changing").execute(ctx, {})  # type: ignore[union-attr]

    instance_id = sv.start_workflow("act.scratch.changing_flow", None)
    drive(clock, activity_queues=[])  # reserved under the old definition
    recorded = task_of(instance_id).options
    assert recorded["retry_policy"]["max_attempts"] == 2

    # New code: other defaults under the same name. The task keeps what was recorded.
    registry.unregister("act.scratch.changing", kind="activity")
    new = sv.activity(
        name="act.scratch.changing",
        queue="other-q",
        start_to_close_timeout=1,
        retry_policy=sv.RetryPolicy(max_attempts=5, initial_interval=1, max_interval=1),
    )(body)
    assert new is not old
    drive(clock)
    assert ledger("changing:") == ["changing:1"]
    task = task_of(instance_id)
    assert (task.queue, task.options, task.status, task.failures) == (
        "changing-q",
        recorded,
        "queued",
        1,
    )
    assert task.not_before_ms - db_now_ms() > 4000  # the recorded 5 s backoff, not 1 s
    clock.advance(5.1)
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert isinstance(result.error, sv.RetryExhaustedError)
    assert result.error.attempts == 2  # the recorded budget, not the new 5
    assert ledger("changing:") == ["changing:1", "changing:2"]


def test_invalid_call_options_raise_value_error_before_anything_is_written(
    worker: Any,
) -> None:
    bad = [
        {"start_to_close_timeout": 0},
        {"heartbeat_timeout": -1},
        {"schedule_to_start_timeout": -0.5},
        {"retry_policy": {"max_attempts": -1}},
        {"retry_policy": {"backoff_coefficient": 0.5}},
        {"retry_policy": {"initial_interval": 10, "max_interval": 5}},
        {"retry_policy": {"initial_interval": 0}},
    ]
    instance_id = sv.start_workflow("act.bad_options", {"attempts": bad})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    messages = result.output
    assert len(messages) == len(bad) + 1
    for message, field in zip(
        messages,
        [
            "start_to_close_timeout",
            "heartbeat_timeout",
            "schedule_to_start_timeout",
            "max_attempts",
            "backoff_coefficient",
            "max_interval",
            "initial_interval",
            "non_retryable_errors",
        ],
        strict=True,
    ):
        assert field in message
    assert "per call" in messages[-1]
    # No command position was taken and no task was written.
    assert list(HistoryEvent.objects.filter(instance_id=instance_id).values_list("key")) == [
        ("$close",)
    ]
    assert not ActivityTask.objects.filter(instance_id=instance_id).exists()


@pytest.mark.parametrize(
    "options",
    [
        {"start_to_close_timeout": 0},
        {"schedule_to_start_timeout": -1},
        {"heartbeat_timeout": float("nan")},
        {"start_to_close_timeout": float("inf")},
        {"heartbeat_timeout": timedelta(seconds=-2)},
    ],
)
def test_invalid_definition_options_raise_value_error_and_register_nothing(
    options: dict[str, Any],
) -> None:
    with pytest.raises(ValueError):
        sv.activity(name="act.scratch.invalid", **options)(lambda data: data)
    assert registry.get_activity("act.scratch.invalid") is None


@pytest.mark.parametrize(
    "policy",
    [
        {"max_attempts": -1},
        {"initial_interval": 0},
        {"initial_interval": -1},
        {"max_interval": float("inf")},
        {"backoff_coefficient": 0.9},
        {"backoff_coefficient": float("nan")},
        {"initial_interval": 2, "max_interval": 1},
    ],
)
def test_invalid_retry_policies_raise_value_error(policy: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        sv.RetryPolicy(**policy)


# -- 3. retries ---------------------------------------------------------------------------


def test_retries_back_off_exponentially_with_a_cap_and_hold_nothing(
    clock: ControllableClock,
) -> None:
    # act.step's policy: 4 attempts, 10 s initial interval, coefficient 2, at most 25 s.
    instance_id = start("act.step", {"tag": "bk", "fail_until": 4})
    delays = []
    for attempt, delay in ((1, 10), (2, 20), (3, 25)):
        started = time.monotonic()
        drive(clock)  # a new worker each time: the backoff is only in the database
        assert ledger("step:bk") == [f"step:bk:{n}" for n in range(1, attempt + 1)]
        task = task_of(instance_id)
        assert (task.status, task.attempts, task.failures) == ("queued", attempt, attempt)
        assert task.claim_owner == ""
        assert isinstance(sv.list_activity_tasks(instance_id)[0].last_error, sv.ApplicationError)
        # Nothing is held during the backoff: no lease, no claim, no thread.
        inst = instance(instance_id)
        assert (inst.lease_owner, inst.runnable) == ("", False)
        # The database clock moves in real time too: the task is due `delay` seconds
        # after its failure, which happened after `started`.
        remaining = (task.not_before_ms - db_now_ms()) / 1000
        elapsed = time.monotonic() - started
        assert delay - elapsed - 0.01 <= remaining <= delay
        delays.append(delay)
        clock.advance(delay / 2)  # far from due whatever real time passes meanwhile
        assert drive(clock) == 0  # not due yet
        clock.advance(delay / 2 + 0.1)

    drive(clock)
    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output["attempt"] == 4
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("completed", 4, 3)
    assert isinstance(info.last_error, sv.ApplicationError)
    assert info.last_error.type == "tests.testapp.workflows.activities.StepError"
    assert info.last_error.message == "attempt 3 of bk failed"
    assert json.loads(history(instance_id, info.key).data)["attempt"] == 4


def test_cancellation_stops_a_task_during_its_backoff(clock: ControllableClock) -> None:
    instance_id = start("act.step", {"tag": "cb", "fail_until": 99})
    drive(clock)  # attempt 1 fails; the task waits 10 s in the queue
    assert task_of(instance_id).status == "queued"
    sv.cancel_workflow(instance_id, reason="stop retrying")
    drive(clock)

    assert sv.get_workflow_result(instance_id).status == "cancelled"
    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures) == ("cancelled", 1, 1)
    assert history(instance_id, task.key).event_type == "ActivityCancelled"
    clock.advance(11)
    assert drive(clock) == 0
    assert ledger("step:cb") == ["step:cb:1"]


def test_workflow_closure_stops_an_unawaited_task_during_its_backoff(
    clock: ControllableClock, scratch: Callable[[str, str], None]
) -> None:
    scratch("act.scratch.closes_early", "workflow")

    @sv.workflow(name="act.scratch.closes_early")
    def closes_early(ctx: sv.WorkflowContext, _: Any) -> str:
        future = wf.step.execute_async(ctx, {"tag": "ce", "fail_until": 99})
        ctx.wait_condition(lambda: ctx.pending("done") > 0)
        return future.key

    instance_id = sv.start_workflow("act.scratch.closes_early", None)
    drive(clock)  # an activity worker ran attempt 1, which failed: backoff
    assert (task_of(instance_id).status, task_of(instance_id).failures) == ("queued", 1)
    sv.signal(instance_id, "done")
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    task = task_of(instance_id)
    assert (task.key, task.status, task.attempts) == (result.output, "cancelled", 1)
    clock.advance(11)
    assert drive(clock) == 0
    assert ledger("step:ce") == ["step:ce:1"]


def test_exhausted_retries_record_retry_exhausted_with_the_last_error(
    clock: ControllableClock,
) -> None:
    policy = {"max_attempts": 2, "initial_interval": 3, "max_interval": 3}
    instance_id = start("act.step", {"tag": "ex", "fail_until": 99}, {"retry_policy": policy})
    drive(clock)
    clock.advance(3.1)
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.RetryExhaustedError)
    assert (error.activity, error.attempts) == ("act.step", 2)
    assert isinstance(error.last_error, sv.ApplicationError)
    assert error.last_error.message == "attempt 2 of ex failed"
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("failed", 2, 2)
    assert info.last_error.message == "attempt 2 of ex failed"  # type: ignore[union-attr]
    row = history(instance_id, info.key)
    assert row.event_type == "ActivityFailed"
    assert json.loads(row.data)["type"] == "RetryExhaustedError"
    assert ledger("step:ex") == ["step:ex:1", "step:ex:2"]


@pytest.mark.parametrize("mode", ["non_retryable_errors", "application_error"])
def test_non_retryable_failures_stop_retrying(clock: ControllableClock, mode: str) -> None:
    # The call's own policy has budget left (and cannot carry error classes).
    options = {"retry_policy": {"max_attempts": 9}}
    if mode == "non_retryable_errors":  # an instance of the definition's listed classes
        instance_id = start("act.defaults", {"tag": "nr", "reject": True}, options)
        expected = ("tests.testapp.workflows.activities.StepRejected", "nr rejected", False)
    else:  # ApplicationError(non_retryable=True)
        instance_id = start("act.step", {"tag": "nr", "final_on": [1]}, options)
        expected = ("Final", "nr is final", True)
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.ApplicationError)  # the failure itself, not RetryExhausted
    assert (error.type, error.message, error.non_retryable) == expected
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("failed", 1, 1)
    assert len(ledger("defaults:nr") + ledger("step:nr")) == 1


class RecordingHooks(WorkflowHooks):
    """Record retry and failure hooks with what the database held when each fired."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int | None, str, int, str]] = []

    def _record(self, name: str, event: HookEvent) -> None:
        task = ActivityTask.objects.get(instance_id=event.instance_id, key=event.key)
        self.events.append(
            (name, event.attempt, task.status, task.failures, type(event.error).__name__)
        )

    def on_activity_retry(self, event: HookEvent) -> None:
        self._record("retry", event)

    def on_activity_failed(self, event: HookEvent) -> None:
        self._record("failed", event)


def test_retry_and_failure_hooks_report_the_claim_number_after_the_durable_write(
    clock: ControllableClock,
) -> None:
    hooks = RecordingHooks()
    policy = {"max_attempts": 3, "initial_interval": 1, "max_interval": 1}
    instance_id = start("act.step", {"tag": "hk", "fail_until": 99}, {"retry_policy": policy})
    for _ in range(3):
        run_until_idle(Worker(clock=clock, hooks=hooks))
        clock.advance(1.1)

    assert hooks.events == [
        ("retry", 1, "queued", 1, "StepError"),
        ("retry", 2, "queued", 2, "StepError"),
        ("failed", 3, "failed", 3, "RetryExhaustedError"),
    ]
    assert isinstance(sv.get_workflow_result(instance_id).error, sv.RetryExhaustedError)


# -- 4. timeouts and heartbeats ---------------------------------------------------------


def test_start_to_close_timeout_caps_the_attempt_and_its_claim(worker: Any, marker: Path) -> None:
    instance_id = start(
        "act.wait",
        {"tag": "s2c", "hold_while": str(marker), "hold_on": [1], "mode": "heartbeat"},
        {"start_to_close_timeout": 1.5, "retry_policy": {"max_attempts": 2, **FAST_RETRY}},
    )
    first_attempt = ActivityTask.objects.filter(
        instance_id=instance_id, status="running", attempts=1
    )
    running = wait_until(first_attempt.first)
    assert running.attempt_deadline_ms == running.claim_started_ms + 1500
    # The claim never reaches past the attempt's deadline, renewals included.
    while (sample := first_attempt.first()) is not None:
        assert sample.claim_expires_ms <= running.attempt_deadline_ms
        time.sleep(0.02)  # sampling while the attempt runs
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "s2c:2"
    # Attempt 1 kept heartbeating; heartbeat() raised once the deadline passed.
    assert ledger("wait:s2c:1") == ["wait:s2c:1:start"]
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.attempts, info.failures) == (2, 1)
    error = info.last_error
    assert isinstance(error, sv.ActivityTimeoutError)
    assert isinstance(error, TimeoutError)
    assert (error.activity, error.kind, error.attempt) == ("act.wait", "start_to_close", 1)


def test_heartbeat_timeout_keeps_the_claim_only_while_the_activity_heartbeats(
    worker: Any, marker: Path
) -> None:
    instance_id = start(
        "act.wait",
        # Heartbeats for 1.5 s (three heartbeat timeouts), then stops heartbeating.
        {"tag": "hb", "hold_while": str(marker), "mode": "quiet", "heartbeat_for": 1.5},
        {"heartbeat_timeout": 0.5, "retry_policy": {"max_attempts": 1}},
    )
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.RetryExhaustedError)
    assert error.attempts == 1
    timeout = error.last_error
    assert isinstance(timeout, sv.ActivityTimeoutError)
    assert isinstance(timeout, TimeoutError)  # also when nested in RetryExhaustedError
    assert (timeout.kind, timeout.attempt) == ("heartbeat", 1)
    # The attempt sees activity_cancelled() once the timeout is recorded, so it may
    # write its entry just after the run has failed.
    wait_until(lambda: ledger("wait:hb") == ["wait:hb:1:cancelled", "wait:hb:1:start"])
    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures) == ("failed", 1, 1)
    assert task.heartbeat_timeout_ms == 500


def test_heartbeating_activity_keeps_one_claim_for_several_lease_ttls(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    first = make_worker(lease=SHORT_LEASE, worker_id="hb-a")
    instance_id = start(
        "act.wait",
        {"tag": "long", "hold_while": str(marker), "mode": "heartbeat"},
        {"heartbeat_timeout": 1.0},
        **{"async": True},
    )
    wait_until(lambda: ledger("wait:long"))
    make_worker(lease=SHORT_LEASE, worker_id="hb-b")  # ready to take over a lapsed claim
    task = task_of(instance_id)
    assert (task.status, task.claim_owner, task.attempts) == ("running", first.worker_id, 1)
    expiries: set[int] = set()

    def one_claim() -> None:
        t = ActivityTask.objects.get(id=task.id)
        assert (t.status, t.claim_owner, t.claim_epoch, t.attempts, t.failures) == (
            "running",
            "hb-a",
            task.claim_epoch,
            1,
            0,
        )
        expiries.add(t.claim_expires_ms)
        assert ledger("wait:long") == ["wait:long:1:start"]

    observe(3 * SHORT_LEASE["TTL"], one_claim)
    assert len(expiries) >= 5  # extended again and again, each time by at most 1 s
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "long:1"
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)


def test_heartbeat_does_no_io_and_reports_cancellation() -> None:
    # No database fixture: pytest-django refuses every query here, so any I/O would fail.
    state = AttemptState(ActivityInfo("i", "w", "#1:a", "a", 1, sv.ActivityOptions()))
    with attempt_scope(state):
        for _ in range(1000):
            sv.heartbeat()
        assert not sv.activity_cancelled()
        assert sv.activity_info() == state.info
        state.cancel("claim lost")
        assert sv.activity_cancelled()
        with pytest.raises(sv.ActivityCancelled, match="claim lost"):
            sv.heartbeat()
    assert state.progress == 1000
    with pytest.raises(sv.NotActivityContext):
        sv.heartbeat()
    assert sv.activity_cancelled() is False
    assert sv.activity_info() is None


def test_heartbeat_raises_once_the_attempt_deadline_passed() -> None:
    info = ActivityInfo("i", "w", "#1:a", "a", 1, sv.ActivityOptions())
    state = AttemptState(info, deadline_monotonic=time.monotonic() + 0.05)
    with attempt_scope(state):
        sv.heartbeat()
        wait_until(sv.activity_cancelled, timeout=5, interval=0.01)
        with pytest.raises(sv.ActivityCancelled, match="deadline"):
            sv.heartbeat()


def test_an_inline_attempt_that_loses_its_claim_stops_and_yields_the_workflow(
    clock: ControllableClock, worker: Any, marker: Path
) -> None:
    instance_id = start(
        "act.wait",
        {"tag": "lost", "hold_while": str(marker), "hold_on": [1], "mode": "heartbeat"},
        {"retry_policy": {"max_attempts": 3, **FAST_RETRY}},
        then="after:lost",
    )
    wait_until(lambda: ledger("wait:lost"))
    task = task_of(instance_id)
    assert (task.status, task.attempts) == ("running", 1)
    # Another owner takes the claim over for a minute: the running attempt has lost it.
    ActivityTask.objects.filter(id=task.id).update(
        claim_owner="thief", claim_epoch=task.claim_epoch + 1, claim_expires_ms=db_now_ms() + 60_000
    )

    # The attempt's next renewal fails, heartbeat() raises ActivityCancelled, and the
    # workflow, which ran the attempt inline, yields: lease and thread are released.
    wait_until(
        lambda: (
            instance(instance_id).lease_owner == ""
            and not worker.runtime.attempts.active_attempts()
        )
    )
    assert ledger("wait:lost") == ["wait:lost:1:start"]
    assert history(instance_id, task.key).data is None
    task.refresh_from_db()
    assert (task.status, task.claim_owner, task.failures) == ("running", "thief", 0)

    clock.advance(61)  # the thief's claim lapses; an activity worker takes the task at once
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "lost:2"
    assert ledger("wait:lost") == ["wait:lost:1:start", "wait:lost:2:end", "wait:lost:2:start"]
    assert ledger("after:lost") == ["after:lost"]
    task.refresh_from_db()
    # The lapse counted as a failure; the fenced attempt 1 could record nothing itself.
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 1)
    assert instance(instance_id).lease_epoch == 2


def test_cancelling_the_workflow_stops_a_heartbeating_attempt(worker: Any, marker: Path) -> None:
    hold = {"hold_while": str(marker), "mode": "heartbeat"}
    instance_id = sv.start_workflow("act.all_ready", {"n": 1, "tag": "cx", "input": hold})
    wait_until(lambda: ledger("wait:cx0"))
    sv.cancel_workflow(instance_id, reason="no longer needed")
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "cancelled"
    task = task_of(instance_id)
    wait_until(lambda: not ActivityTask.objects.filter(id=task.id, claim_owner__gt="").exists())
    task.refresh_from_db()
    assert (task.status, task.attempts) == ("cancelled", 1)
    # heartbeat() raised in the attempt (the marker still exists): it never finished,
    # and its failure could not be recorded over the cancellation.
    wait_until(lambda: not worker.runtime.attempts.active_attempts())
    assert ledger("wait:cx0") == ["wait:cx0:1:start"]
    assert history(instance_id, task.key).event_type == "ActivityCancelled"


def test_an_attempt_that_ignores_cancellation_cannot_replace_the_outcome(
    worker: Any, marker: Path
) -> None:
    instance_id = start(
        "act.wait",
        {"tag": "ign", "hold_while": str(marker), "hold_on": [1], "mode": "ignore"},
        {"start_to_close_timeout": 2, "retry_policy": {"max_attempts": 3, **FAST_RETRY}},
    )
    # Attempt 1 (inline, on the workflow thread) overruns its deadline; its claim lapses
    # and attempt 2 completes in an activity worker while attempt 1 keeps running.
    task = task_of(wait_until(lambda: ledger("wait:ign") and instance_id))
    wait_until(lambda: ActivityTask.objects.filter(id=task.id, status="completed").exists())
    row = history(instance_id, task.key)
    assert (row.event_type, json.loads(row.data)) == ("ActivityCompleted", "ign:2")
    assert ledger("wait:ign:1") == ["wait:ign:1:start"]

    marker.unlink()  # attempt 1 finally returns its own, late result
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "ign:2"
    assert ledger("wait:ign:1") == ["wait:ign:1:end", "wait:ign:1:start"]
    row.refresh_from_db()
    assert (row.event_type, json.loads(row.data)) == ("ActivityCompleted", "ign:2")
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures) == ("completed", 2, 1)


# -- schedule-to-start timeouts, lapsed claims and the leader ---------------------------


def unserved(tag: str, s2s: float, **extra: Any) -> str:
    """Start act.step on a queue with a schedule-to-start timeout."""
    options = {"queue": "s2s-q", "schedule_to_start_timeout": s2s, **extra}
    return start("act.step", {"tag": tag, **extra.pop("input", {})}, options)


def assert_schedule_timeout(instance_id: str, attempts: int, failures: int) -> None:
    """The task failed for good with a schedule-to-start timeout; so did the workflow."""
    result = sv.get_workflow_result(instance_id)
    assert result.status == "failed"
    error = result.error
    # Final: not wrapped in RetryExhaustedError although retry budget was left.
    assert isinstance(error, sv.ActivityTimeoutError)
    assert isinstance(error, TimeoutError)
    assert (error.activity, error.kind, error.attempt) == (
        "act.step",
        "schedule_to_start",
        attempts,
    )
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("failed", attempts, failures)
    assert isinstance(info.last_error, sv.ActivityTimeoutError)
    assert info.last_error.kind == "schedule_to_start"
    row = history(instance_id, info.key)
    assert row.event_type == "ActivityFailed"


def test_schedule_to_start_is_measured_from_reservation(clock: ControllableClock) -> None:
    instance_id = start(
        "act.step", {"tag": "s2s"}, {"queue": "s2s-q", "schedule_to_start_timeout": 10}
    )
    drive(clock, activity_queues=["elsewhere"])  # reserved; nobody serves s2s-q
    task = task_of(instance_id)
    assert task.schedule_deadline_ms is not None
    clock.advance(9.5)
    assert sweep(clock) == 0
    assert task_of(instance_id).status == "queued"

    clock.advance(0.6)
    assert sweep(clock) == 1
    drive(clock, activity_queues=["elsewhere"])

    assert_schedule_timeout(instance_id, attempts=0, failures=0)
    assert ledger("step:s2s") == []


def test_schedule_to_start_after_a_retry_is_measured_from_its_due_time(
    clock: ControllableClock,
) -> None:
    policy = {"max_attempts": 5, "initial_interval": 20, "max_interval": 20}
    instance_id = start(
        "act.step",
        {"tag": "due", "fail_until": 99},
        {"schedule_to_start_timeout": 5, "retry_policy": policy},
    )
    drive(clock)  # attempt 1 fails; due again in 20 s
    assert task_of(instance_id).failures == 1
    clock.advance(24)  # 4 s past the due time: still waiting for a worker
    assert sweep(clock) == 0
    clock.advance(1.5)
    assert sweep(clock) == 1
    drive(clock, activity_queues=[])

    assert_schedule_timeout(instance_id, attempts=1, failures=1)
    assert ledger("step:due") == ["step:due:1"]


def test_schedule_to_start_after_a_release_is_measured_from_the_release(
    clock: ControllableClock,
) -> None:
    instance_id = start(
        "act.step", {"tag": "rel"}, {"queue": "s2s-q", "schedule_to_start_timeout": 10}
    )
    drive(clock, activity_queues=[])
    clock.advance(8)
    store = store_for("default", Codec())
    (claimed,) = store.tasks.claim_tasks("leaving", 1, ["act.step"])
    clock.advance(8)  # 16 s after the reservation, 8 s into the claim
    assert store.tasks.release_task(claimed.claim)  # a graceful release at shutdown
    clock.advance(9.5)
    assert sweep(clock) == 0
    clock.advance(0.6)
    assert sweep(clock) == 1
    drive(clock, activity_queues=[])

    assert_schedule_timeout(instance_id, attempts=1, failures=0)


def test_schedule_to_start_after_a_lapse_is_measured_from_the_lapse(
    clock: ControllableClock,
) -> None:
    instance_id = start(
        "act.step", {"tag": "lap"}, {"queue": "s2s-q", "schedule_to_start_timeout": 10}
    )
    drive(clock, activity_queues=[])
    store = store_for("default", Codec())
    store.options.lease_ttl = 5
    (claimed,) = store.tasks.claim_tasks("dies", 1, ["act.step"])  # its claim lapses in 5 s
    clock.advance(9)  # lapsed 4 s ago, but no leader has swept yet
    assert sweep(clock) == 1  # the leader counts the lapse as a failure and requeues
    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures, task.claim_owner) == ("queued", 1, 1, "")
    clock.advance(5.5)  # 9.5 s after the lapse
    assert sweep(clock) == 0
    clock.advance(0.6)
    assert sweep(clock) == 1
    drive(clock, activity_queues=[])

    assert_schedule_timeout(instance_id, attempts=1, failures=1)
    assert claimed.attempt == 1


def test_a_lapsed_claim_counts_as_a_failure_and_is_reclaimed_at_once(
    clock: ControllableClock,
) -> None:
    # act.step's policy backs off 10 s after a failure; a lapse is retried without backoff.
    instance_id = start("act.step", {"tag": "lapse"}, {"queue": "lapse-q"})
    drive(clock, activity_queues=[])
    store = store_for("default", Codec())
    store.options.lease_ttl = 5
    (dead,) = store.tasks.claim_tasks("dead-worker", 1, ["act.step"])
    # The database clock also runs in real time: leave a second for a loaded machine.
    clock.advance(4.0)
    assert drive(clock) == 0  # the claim is still alive
    clock.advance(1.1)
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output["attempt"] == 2
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("completed", 2, 1)
    assert isinstance(info.last_error, sv.ActivityTimeoutError)
    # No timeout was configured: what happened is that the claim lapsed.
    assert (info.last_error.kind, info.last_error.attempt) == ("claim_lapsed", 1)
    assert ledger("step:lapse") == ["step:lapse:2"]  # attempt 1 never ran its body here
    assert store.tasks.complete_task(dead.claim, json.dumps("late")) is False


@pytest.mark.parametrize(
    ("heartbeat", "kind"), [(None, "claim_lapsed"), (3, "heartbeat")], ids=["plain", "heartbeat"]
)
def test_the_leader_fails_a_lapse_that_exhausts_the_retry_budget(
    clock: ControllableClock, heartbeat: float | None, kind: str
) -> None:
    options: dict[str, Any] = {"queue": "lapse-q", "retry_policy": {"max_attempts": 1}}
    if heartbeat is not None:
        options["heartbeat_timeout"] = heartbeat
    instance_id = start("act.step", {"tag": "gone"}, options)
    drive(clock, activity_queues=[])
    store = store_for("default", Codec())
    store.options.lease_ttl = 5
    store.tasks.claim_tasks("dead-worker", 1, ["act.step"])
    clock.advance(5.1)
    assert store.tasks.claim_tasks("successor", 1, ["act.step"]) == []  # no budget left to reclaim
    sweep(clock)  # the leader records the exhausted lapse
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.RetryExhaustedError)
    assert error.attempts == 1
    assert isinstance(error.last_error, sv.ActivityTimeoutError)
    assert isinstance(error.last_error, TimeoutError)
    assert (error.last_error.kind, error.last_error.attempt) == (kind, 1)
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("failed", 1, 1)
    assert isinstance(info.last_error, sv.ActivityTimeoutError)


def test_one_elected_leader_and_a_successor_when_it_stops(
    make_worker: Callable[..., Any],
) -> None:
    # A lease long enough that a loaded machine's late heartbeat cannot lose it, with
    # heartbeats well inside it.
    leader_settings = {"leader_lease_duration": 3.0, "leader_heartbeat_interval": 0.2}
    workers = [make_worker(worker_id=f"lead-{i}", **leader_settings) for i in range(2)]
    store = store_for("default", Codec())

    def led_by() -> str | None:
        # The lock row commits before its taker notes that it leads: wait for both.
        holder = store.locks.lock_owner(LEADER_LOCK)
        leading = [w.worker_id for w in workers if w.leader.is_leader]
        return holder if holder and leading == [holder] else None

    owner = wait_until(led_by)
    assert owner in ("lead-0", "lead-1")

    def exactly_one() -> None:
        assert [w.worker_id for w in workers if w.leader.is_leader] == [owner]
        assert store.locks.lock_owner(LEADER_LOCK) == owner

    observe(3.5, exactly_one)  # longer than the lease: the leader renews it
    leader = next(w for w in workers if w.worker_id == owner)
    other = next(w for w in workers if w.worker_id != owner)
    leader.stop(timeout=5)
    wait_until(lambda: store.locks.lock_owner(LEADER_LOCK) == other.worker_id)
    wait_until(lambda: other.leader.is_leader)


def test_only_the_leader_records_timeouts_and_a_silent_leader_is_replaced(
    clock: ControllableClock, make_worker: Callable[..., Any]
) -> None:
    store = store_for("default", Codec())
    # A leader that died: it holds the lock (for 30 s) but sweeps nothing.
    assert store.locks.try_lock(LEADER_LOCK, "silent", 30)
    instance_id = start(
        "act.step", {"tag": "ldr"}, {"queue": "s2s-q", "schedule_to_start_timeout": 1}
    )
    live = make_worker(
        clock=clock,
        activity_queues=["elsewhere"],
        leader_lease_duration=2,
        leader_heartbeat_interval=0.2,
    )
    wait_until(
        lambda: (
            ActivityTask.objects.filter(instance_id=instance_id).exists()
            and instance(instance_id).lease_owner == ""
        )
    )
    clock.advance(2)  # the task's wait has timed out, but no live worker leads

    def unrecorded() -> None:
        assert not live.leader.is_leader
        assert task_of(instance_id).status == "queued"

    observe(0.5, unrecorded)
    clock.advance(29)  # the silent leader's lease has run out
    result = sv.wait_workflow(instance_id, timeout=20)

    assert live.leader.is_leader
    assert store.locks.lock_owner(LEADER_LOCK) == live.worker_id
    assert isinstance(result.error, sv.ActivityTimeoutError)
    assert result.error.kind == "schedule_to_start"


# -- 5. attempt numbers -----------------------------------------------------------------


def test_a_graceful_release_uses_an_attempt_number_but_no_retry_budget(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    first = make_worker(worker_id="leaving")
    instance_id = start(
        "act.wait",
        {"tag": "rel", "hold_while": str(marker), "hold_on": [1], "mode": "heartbeat"},
        {"retry_policy": {"max_attempts": 1}},  # no retries at all
    )
    wait_until(lambda: ledger("wait:rel"))
    first.stop(timeout=0.5)  # attempt 1 is still running: heartbeat() raises, claim released

    task = task_of(instance_id)
    assert (task.status, task.attempts, task.failures, task.claim_owner) == ("queued", 1, 0, "")
    assert task.last_error is None
    make_worker(worker_id="successor")
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    assert result.output == "rel:2"  # activity_info().attempt == 2 > max_attempts
    task.refresh_from_db()
    assert (task.status, task.attempts, task.failures, task.claim_owner) == (
        "completed",
        2,
        0,
        "successor",
    )
    assert ledger("wait:rel") == ["wait:rel:1:start", "wait:rel:2:end", "wait:rel:2:start"]


def _fail_claim_read_back(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """Break the connection while a claim is read back, after its UPDATE ran."""
    if sql.lstrip().upper().startswith("SELECT") and re.search(r'\bclaim_owner"? = ', sql):
        raise OperationalError("connection lost while reading the claim back")
    return execute(sql, params, many, context)


@pytest.mark.parametrize("lapsed", [False, True], ids=["queued", "lapsed"])
def test_an_interrupted_claim_acquisition_consumes_no_attempt_and_no_budget(
    clock: ControllableClock, lapsed: bool
) -> None:
    instance_id = start("act.step", {"tag": "intr"}, {"queue": "intr-q"})
    drive(clock, activity_queues=[])
    store = store_for("default", Codec())
    store.options.lease_ttl = 5
    if lapsed:
        store.tasks.claim_tasks("dead-worker", 1, ["act.step"])
        clock.advance(5.1)
    before = ActivityTask.objects.filter(instance_id=instance_id).values().get()

    with connection.execute_wrapper(_fail_claim_read_back), pytest.raises(OperationalError):
        store.tasks.claim_tasks("interrupted", 1, ["act.step"])
    with connection.execute_wrapper(_fail_claim_read_back), pytest.raises(OperationalError):
        store.claim_task(instance_id, before["key"], "interrupted")

    # Both acquisitions rolled back: ownership, attempt number and failures are untouched.
    after = ActivityTask.objects.filter(instance_id=instance_id).values().get()
    assert after == before
    drive(clock)
    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output["attempt"] == (2 if lapsed else 1)
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.attempts, info.failures) == ((2, 1) if lapsed else (1, 0))


# -- 6. queues ----------------------------------------------------------------------------


def test_activity_queues_restrict_background_and_inline_attempts(
    clock: ControllableClock,
) -> None:
    on_a = start("act.step", {"tag": "qa"}, {"queue": "qa"})  # inline through execute()
    on_b = start("act.step", {"tag": "qb"}, {"queue": "qb"})
    on_default = start("act.step", {"tag": "q0"}, **{"async": True})  # queue ""
    unknown = start("act.step", {"tag": "qx"}, {"queue": "no-such-queue-anywhere"})

    drive(clock, activity_queues=[])  # an empty list serves no queue, not even inline
    assert ledger("step:") == []
    assert {task_of(i).status for i in (on_a, on_b, on_default, unknown)} == {"queued"}

    drive(clock, activity_queues=["qa", ""])
    assert ledger("step:") == ["step:q0:1", "step:qa:1"]
    assert sv.get_workflow_result(on_a).status == "completed"
    assert sv.get_workflow_result(on_default).status == "completed"
    assert (task_of(on_b).status, task_of(on_b).attempts) == ("queued", 0)

    drive(clock)  # omitted: every queue, including names nobody configured
    assert sv.get_workflow_result(on_b).status == "completed"
    assert sv.get_workflow_result(unknown).output["options"]["queue"] == "no-such-queue-anywhere"
    assert ledger("step:") == ["step:q0:1", "step:qa:1", "step:qb:1", "step:qx:1"]


def test_tasks_of_unregistered_activities_stay_queued_until_one_registers(
    clock: ControllableClock, scratch: Callable[[str, str], None]
) -> None:
    scratch("act.scratch.late", "activity")
    instance_id = sv.start_workflow("test.worker.unserved", {})
    store = store_for("default", Codec())
    fence = store.instances.acquire(instance_id, "issuer", ttl=60)
    assert fence is not None
    spec = TaskSpec(
        name="act.scratch.late",
        workflow_name="test.worker.unserved",
        input=json.dumps("late"),
        queue="",
        options={},
        max_attempts=3,
        schedule_to_start_timeout=None,
        start_to_close_timeout=None,
        heartbeat_timeout=None,
    )
    store.reserve_activity(fence, HistoryRow("#1:act.scratch.late", 1, "activity"), spec, None)
    store.release_lease(fence)

    assert drive(clock) == 0
    task = ActivityTask.objects.get(instance_id=instance_id)
    assert (task.status, task.attempts, task.claim_owner) == ("queued", 0, "")

    # A worker of a later deployment registers it and recovers the pending task.
    sv.activity(name="act.scratch.late")(lambda data: f"ran {data}")
    drive(clock)
    task.refresh_from_db()
    assert (task.status, task.attempts) == ("completed", 1)
    assert history(instance_id, "#1:act.scratch.late").data == json.dumps("ran late")


# -- 7. transactional activities ----------------------------------------------------------


def test_a_failed_transactional_attempt_leaves_none_of_its_writes(
    clock: ControllableClock,
) -> None:
    policy = {"max_attempts": 3, "initial_interval": 1, "max_interval": 1}
    instance_id = start("act.tx_stall", {"tag": "f", "fail_on": [1, 2]}, {"retry_policy": policy})
    for _ in range(3):
        drive(clock)
        clock.advance(1.1)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output == "txs:f:3"
    assert ledger("txs:f") == ["txs:f:3"]  # attempts 1 and 2 wrote, then rolled back
    (info,) = sv.list_activity_tasks(instance_id)
    # Their failure records were not rolled back with them.
    assert (info.attempts, info.failures) == (3, 2)
    assert isinstance(info.last_error, sv.ApplicationError)
    assert info.last_error.message == "attempt 2 failed after writing"


def test_an_exhausted_transactional_activity_leaves_no_writes(clock: ControllableClock) -> None:
    policy = {"max_attempts": 2, "initial_interval": 1, "max_interval": 1}
    instance_id = start("act.tx_stall", {"tag": "n", "fail_on": [1, 2]}, {"retry_policy": policy})
    drive(clock)
    clock.advance(1.1)
    drive(clock)

    assert isinstance(sv.get_workflow_result(instance_id).error, sv.RetryExhaustedError)
    assert ledger("txs:n") == []


def test_a_timed_out_transactional_attempt_rolls_back_its_writes(
    clock: ControllableClock,
) -> None:
    instance_id = start(
        "act.tx_stall",
        {"tag": "t", "stall_on": [1]},
        {
            "start_to_close_timeout": 1.0,
            "retry_policy": {"max_attempts": 2, "initial_interval": 1, "max_interval": 1},
        },
    )
    # Attempt 1 writes, outlives its deadline (where its claim ends) and returns: rolled
    # back. Its claim lapsed at the deadline, so the lapse path reclaims the task at once,
    # without the retry backoff.
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output == "txs:t:2"
    assert ledger("txs:t") == ["txs:t:2"]
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.attempts, info.failures) == (2, 1)
    assert isinstance(info.last_error, sv.ActivityTimeoutError)
    assert (info.last_error.kind, info.last_error.attempt) == ("start_to_close", 1)


# -- bad results --------------------------------------------------------------------------


def test_a_non_json_result_fails_the_attempt_with_a_clear_error(clock: ControllableClock) -> None:
    instance_id = start(
        "act.step",
        {"tag": "nj", "non_json_on": [1]},
        {"retry_policy": {"max_attempts": 2, "initial_interval": 1, "max_interval": 1}},
    )
    drive(clock)
    (info,) = sv.list_activity_tasks(instance_id)
    assert (info.status, info.attempts, info.failures) == ("queued", 1, 1)
    error = info.last_error
    assert isinstance(error, sv.ApplicationError)
    assert "act.step" in error.message and "JSON" in error.message, error.message
    assert history(instance_id, info.key).data is None  # history untouched
    clock.advance(1.1)
    drive(clock)

    result = sv.get_workflow_result(instance_id)
    assert result.status == "completed", result.error
    assert result.output["attempt"] == 2
    row = history(instance_id, info.key)
    assert (row.event_type, json.loads(row.data)["attempt"]) == ("ActivityCompleted", 2)


def test_run_until_idle_logs_an_activitys_system_exit_and_goes_on_like_the_worker(
    clock: ControllableClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's pool thread logs the SystemExit an activity raised (after the attempt
    recorded it) and carries on; the helper that runs those loops in the test's thread
    does the same, so the test sees the recorded outcomes, not the exception."""
    from selvedge_django.operations.instances import start_with_activity

    def body(_: Any) -> None:
        raise SystemExit(2)

    exits = sv.activity(name="act.scratch.exits")(body)

    @sv.workflow(name="act.scratch.exits_flow")
    def flow(ctx: sv.WorkflowContext, data: Any) -> Any:
        return exits.execute(ctx, data, activity_id="only")

    flow.result_activity = "only"
    try:
        # Queued with the start, so the activity loop (not an execution) claims them.
        started = [
            start_with_activity(flow, {}, exits, sv.ActivityOptions(), instance_id=iid)
            for iid in ("exits-1", "exits-2")
        ]
        run_until_idle(Worker())
        assert [sv.describe(iid).status for iid in started] == ["failed", "failed"]
        assert "SystemExit" in caplog.text
    finally:
        registry.unregister("act.scratch.exits", kind="activity")
        registry.unregister("act.scratch.exits_flow", kind="workflow")
