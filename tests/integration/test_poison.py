"""Poison instances: a storage error that recurs on every replay backs off and ends.

An execution that ends because a statement failed used to release its lease
with the instance runnable at once: a write that fails on every replay turned
the instance into a hot loop, with no backoff, no attempt limit and no way out.
Now a data error (the database refuses a value: retrying cannot help) fails the
instance at once with :class:`ExecutionStorageError`; any other error holds the
instance back, exponentially longer after each consecutive one (the count and
the last error are on the instance), until ``MAX_EXECUTION_ERRORS`` fails it the
same way; other instances keep running meanwhile, and an operator can
terminate it. Values that would overflow the database (durations) are refused
where they enter, before anything is written.

Each case runs an unstarted worker with ``run_until_idle`` on a controllable
clock, so the backoff is stepped through without waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, IntegrityError

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.durations import MAX_DURATION_SECONDS, to_seconds
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.storage import store_for
from selvedge_django.testing import (
    ControllableClock,
    FaultInjector,
    installed_clock,
    run_until_idle,
)
from selvedge_django.worker import Worker

BACKOFF = {
    "run_local_starts": False,
    "execution_error_backoff": 1,
    "max_execution_error_backoff": 4,
    "max_execution_errors": 5,
}


@pytest.fixture
def clock(tdb: None) -> Iterator[ControllableClock]:
    with installed_clock() as installed:
        yield installed


@pytest.fixture
def faults(tdb: None) -> Iterator[FaultInjector]:
    with FaultInjector() as injector:
        yield injector


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def db_now_ms() -> int:
    return store_for("default", Codec()).now_ms()


def held_back_ms(instance_id: str) -> int:
    """How long (database clock) the instance is held back from dispatch."""
    return instance(instance_id).ready_ms - db_now_ms()


def poison(faults: FaultInjector, error: Any = None) -> tuple[str, Any]:
    """A poison.sleep instance whose timer reservation fails on every replay."""
    iid = sv.start_workflow("poison.sleep", 60)
    fault = faults.fail_statement(
        operation="reserve_timer", instance_id=iid, times=10**6, exc=error
    )
    return iid, fault


def test_a_transient_error_on_every_replay_backs_off_exponentially_then_fails(
    clock: ControllableClock, faults: FaultInjector
) -> None:
    iid, fault = poison(faults)
    healthy = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    worker = Worker(clock=clock, **BACKOFF)
    # Before: every round replayed the instance again (still busy after 200 rounds).
    run_until_idle(worker, max_rounds=200)
    # Others keep running.
    assert sv.get_workflow_result(healthy).output == 6
    for errors, backoff in enumerate([1, 2, 4, 4], start=1):
        inst = instance(iid)
        assert (inst.status, inst.execution_errors, fault.fired) == ("running", errors, errors)
        assert inst.lease_owner == "" and inst.runnable
        assert "InjectedFault" in inst.execution_error
        assert "reserve_timer" in inst.execution_error
        wait = held_back_ms(iid)
        assert backoff * 1000 - 1000 < wait <= backoff * 1000
        # Not before its time: a signal or a cancel request does not cut the wait short.
        clock.advance(timedelta(milliseconds=wait - 200))
        sv.signal(iid, "nudge", None)
        sv.cancel_workflow(iid, "please stop")
        assert run_until_idle(worker) == 0
        assert fault.fired == errors
        clock.advance(0.3)
        run_until_idle(worker)
    # The fifth error in a row is the last: the instance fails with a typed error.
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.ExecutionStorageError)
    assert result.error.instance_id == iid
    assert result.error.errors == 5 and not result.error.data_error
    assert "InjectedFault" in str(result.error)
    assert fault.fired == 5
    clock.advance(60)
    assert run_until_idle(worker) == 0 and fault.fired == 5
    assert HistoryEvent.objects.filter(instance_id=iid, key="$close").count() == 1


def test_terminate_ends_a_poison_instance_that_cancelling_cannot(
    clock: ControllableClock, faults: FaultInjector
) -> None:
    iid, fault = poison(faults)
    worker = Worker(clock=clock, **{**BACKOFF, "max_execution_errors": None})
    run_until_idle(worker)
    # A cancel request needs the workflow code to observe it: the replay fails first.
    sv.cancel_workflow(iid, "stop")
    clock.advance(1.1)
    run_until_idle(worker)
    assert (instance(iid).status, fault.fired) == ("running", 2)
    sv.terminate_workflow(iid, "poisoned")
    result = sv.get_workflow_result(iid)
    assert isinstance(result.error, sv.WorkflowTerminated) and result.error.reason == "poisoned"
    clock.advance(60)
    assert run_until_idle(worker) == 0 and fault.fired == 2


@pytest.mark.parametrize("error", [DataError, IntegrityError], ids=lambda e: e.__name__)
def test_a_data_error_fails_the_instance_at_once_with_a_typed_error(
    clock: ControllableClock, faults: FaultInjector, error: type[Exception]
) -> None:
    iid, fault = poison(faults, error)
    run_until_idle(Worker(clock=clock, **BACKOFF), max_rounds=200)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed", instance(iid).execution_error
    assert isinstance(result.error, sv.ExecutionStorageError)
    assert result.error.data_error and result.error.errors == 1
    assert error.__name__ in str(result.error)
    assert fault.fired == 1


def test_a_recovered_instance_starts_counting_again(
    clock: ControllableClock, faults: FaultInjector
) -> None:
    iid = sv.start_workflow("poison.sleep", 1)
    fault = faults.fail_statement(operation="reserve_timer", instance_id=iid, times=2)
    worker = Worker(clock=clock, **BACKOFF)
    run_until_idle(worker)
    clock.advance(1.1)
    run_until_idle(worker)
    assert (fault.fired, instance(iid).execution_errors) == (2, 2)
    clock.advance(2.1)
    run_until_idle(worker)  # the timer is armed: the execution suspended normally
    inst = instance(iid)
    assert (inst.execution_errors, inst.execution_error) == (0, "")
    clock.advance(1.1)
    run_until_idle(worker)
    assert sv.get_workflow_result(iid).output == "woke"


def test_an_unlimited_worker_keeps_backing_off_at_the_cap(
    clock: ControllableClock, faults: FaultInjector
) -> None:
    iid, fault = poison(faults)
    worker = Worker(clock=clock, **{**BACKOFF, "max_execution_errors": None})
    for _ in range(8):
        run_until_idle(worker)
        clock.advance(4.1)
    inst = instance(iid)
    assert (inst.status, inst.execution_errors, fault.fired) == ("running", 8, 8)


def test_the_backoff_settings_are_validated() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from selvedge_django.conf import resolve_settings

    settings = resolve_settings({})
    assert settings.execution_error_backoff == 1.0
    assert settings.max_execution_error_backoff == 300.0
    assert settings.max_execution_errors == 50
    assert resolve_settings({"MAX_EXECUTION_ERRORS": None}).max_execution_errors is None
    for bad in (
        {"EXECUTION_ERROR_BACKOFF": 0},
        {"MAX_EXECUTION_ERROR_BACKOFF": -1},
        {"EXECUTION_ERROR_BACKOFF": 10, "MAX_EXECUTION_ERROR_BACKOFF": 5},
        {"MAX_EXECUTION_ERRORS": 0},
        {"MAX_EXECUTION_ERRORS": 1.5},
    ):
        with pytest.raises(ImproperlyConfigured):
            resolve_settings(bad)


# -- values that would overflow the database are refused where they enter -------------


@pytest.mark.parametrize(
    "options",
    [
        {"start_to_close_timeout": 1e17},
        {"schedule_to_start_timeout": 86400 * 999_999_999},
        {"heartbeat_timeout": 1e300},
        {"retry_policy": {"max_interval": 1e17}},
        {"retry_policy": {"initial_interval": 1e17, "max_interval": 1e17}},
    ],
    ids=["start_to_close", "schedule_to_start", "heartbeat", "max_interval", "initial_interval"],
)
def test_an_activity_duration_too_long_to_store_fails_the_run_with_nothing_written(
    clock: ControllableClock, options: dict[str, Any]
) -> None:
    # Before: the reservation's BIGINT overflowed on every replay (SQLite OverflowError,
    # PostgreSQL DataError): a hot loop.
    iid = sv.start_workflow("poison.options", options)
    run_until_idle(Worker(clock=clock, **BACKOFF), max_rounds=200)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError)
    assert result.error.type == "ValueError"
    assert "at most" in str(result.error)
    assert not ActivityTask.objects.filter(instance_id=iid).exists()


@pytest.mark.parametrize("form", ["sleep", "receive"])
def test_a_wait_too_long_to_store_raises_a_clear_error_with_nothing_written(
    clock: ControllableClock, form: str
) -> None:
    iid = sv.start_workflow("poison.wait", {"form": form, "seconds": 1e13})
    run_until_idle(Worker(clock=clock, **BACKOFF), max_rounds=200)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError)
    assert result.error.type == "ValueError", result.error
    assert "at most" in str(result.error)
    assert HistoryEvent.objects.filter(instance_id=iid).count() == 1  # the close only


def test_durations_are_bounded_where_they_enter() -> None:
    assert to_seconds(MAX_DURATION_SECONDS, "d") == MAX_DURATION_SECONDS
    assert MAX_DURATION_SECONDS * 1000 < 2**62  # milliseconds fit a BIGINT with room
    for value in (MAX_DURATION_SECONDS + 1, timedelta.max, 1e300):
        with pytest.raises(ValueError, match="at most"):
            to_seconds(value, "d")
    # Nonpositive waits (sleep, receive timeouts) expire at once, however negative.
    assert to_seconds(-1e300, "d", allow_nonpositive=True) == -1e300
    with pytest.raises(ValueError):
        to_seconds(math.inf, "d")
    with pytest.raises(ValueError, match="at most"):
        sv.RetryPolicy(max_interval=1e17)
    with pytest.raises(ValueError, match="at most"):
        sv.ActivityOptions(start_to_close_timeout=1e17)


def test_keys_and_queues_no_database_can_store_are_refused_in_the_workflow(
    clock: ControllableClock,
) -> None:
    # Before: SQLite stored a NUL that PostgreSQL refuses (a DataError on every replay),
    # and neither could encode a lone surrogate.
    iid = sv.start_workflow("poison.keys", None)
    run_until_idle(Worker(clock=clock, **BACKOFF), max_rounds=200)
    result = sv.get_workflow_result(iid)
    assert result.output == ["HistoryKeyConflict"] * 3 + ["ValueError"] * 2, result.error
    assert HistoryEvent.objects.filter(instance_id=iid).count() == 1  # the close only
