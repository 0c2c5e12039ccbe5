"""``async def`` activities, refused ``async def`` workflows, and async callers.

An async activity runs on an event loop of its own, on the thread that runs the
attempt (the workflow's, inline, or an activity thread); ``activity_info()`` and
``heartbeat()`` work inside it, and a stopped attempt (deadline, cancellation,
lost claim, shutdown) cancels the coroutine at its next ``await``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.test import override_settings

import selvedge_django as sv
from selvedge_django import operations, registry
from tests.conftest import wait_until

EVENTS: list[str] = []


@pytest.fixture(autouse=True)
def _clear_events() -> Iterator[None]:
    EVENTS.clear()
    yield
    # The async twins run their queries on asgiref's executor thread, whose database
    # connection outlives the test: close it, or the test database cannot be dropped.
    asyncio.run(sync_to_async(connections.close_all)())


@sv.activity(name="async.greet")
async def greet(name: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    info = sv.activity_info()
    assert info is not None
    sv.heartbeat()
    await asyncio.sleep(0.01)
    sv.heartbeat()
    return {
        "greeting": f"Hello, {name}",
        "attempt": info.attempt,
        "loop_thread": threading.current_thread().name,
        "loop_open": not loop.is_closed(),
    }


@sv.workflow(name="async.greeting")
def greeting(ctx: sv.WorkflowContext, name: str) -> dict[str, Any]:
    return greet.execute(ctx, name)


@sv.activity(name="async.hang", start_to_close_timeout=30)
async def hang(tag: str) -> str:
    EVENTS.append(f"{tag}:started")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        EVENTS.append(f"{tag}:cancelled:{sv.activity_cancelled()}")
        raise
    return "never"


@sv.workflow(name="async.hanging")
def hanging(ctx: sv.WorkflowContext, data: dict[str, Any]) -> str:
    options = sv.ActivityOptions(
        start_to_close_timeout=data.get("timeout"),
        retry_policy=sv.RetryPolicy(max_attempts=1),
    )
    # In the background (not inline on this thread), so a cancel request reaches the
    # workflow while the attempt runs, and closing it cancels the task.
    future = hang.execute_async(ctx, data["tag"], options=options)
    ctx.wait_condition(future.is_ready)
    return future.get(ctx)


@sv.activity(name="async.double")
async def double(n: int) -> int:
    await asyncio.sleep(0)
    return 2 * n


def test_an_async_activity_runs_on_an_event_loop_of_its_own(worker: Any) -> None:
    instance_id = sv.start_workflow(greeting, "Ada")
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "completed", result.error
    output = result.output
    assert output["greeting"] == "Hello, Ada"
    assert output["attempt"] == 1
    assert output["loop_open"] is True
    assert output["loop_thread"] != threading.current_thread().name
    (task,) = sv.list_activity_tasks(instance_id)
    assert (task.status, task.attempts, task.failures) == ("completed", 1, 0)


def test_an_async_activity_is_cancelled_at_its_deadline(worker: Any) -> None:
    started = time.monotonic()
    instance_id = sv.start_workflow(hanging, {"tag": "deadline", "timeout": 0.5})
    result = sv.wait_workflow(instance_id, timeout=20)

    assert result.status == "failed"
    assert isinstance(result.error, sv.ActivityTimeoutError | sv.RetryExhaustedError), result.error
    assert "start_to_close" in str(result.error)
    assert EVENTS == ["deadline:started", "deadline:cancelled:True"]
    assert time.monotonic() - started < 20  # not the 60 s the coroutine asked for


def test_cancelling_the_workflow_cancels_a_running_async_attempt(worker: Any) -> None:
    instance_id = sv.start_workflow(hanging, {"tag": "cancel"})
    wait_until(lambda: "cancel:started" in EVENTS)
    sv.cancel_workflow(instance_id, reason="no longer needed")

    assert sv.wait_workflow(instance_id, timeout=20).status == "cancelled"
    wait_until(lambda: "cancel:cancelled:True" in EVENTS)
    wait_until(lambda: not worker.runtime.attempts.active_attempts())
    (task,) = sv.list_activity_tasks(instance_id)
    assert task.status == "cancelled"


def test_an_async_activity_called_directly_runs_to_completion() -> None:
    assert double(21) == 42


def test_async_workflows_are_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match=r"async def.*workflow.*activit"):

        @sv.workflow(name="async.refused")
        async def refused(ctx: sv.WorkflowContext, _: None) -> None:
            pass

    assert registry.get_workflow("async.refused") is None


def test_transactional_async_activities_are_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match="transactional"):

        @sv.activity(name="async.transactional", transactional=True)
        async def transactional(_: None) -> None:
            pass

    assert registry.get_activity("async.transactional") is None


# -- async callers ----------------------------------------------------------------------


@sv.workflow(name="async.waits_for_go")
def waits_for_go(ctx: sv.WorkflowContext, _: None) -> Any:
    return ctx.receive("go")


def test_await_workflow_is_woken_by_the_close_like_wait_workflow(worker: Any) -> None:
    # A poll interval far beyond the test's deadlines: only a wake-up can end the wait.
    with override_settings(SELVEDGE={**settings.SELVEDGE, "WAIT_POLL_INTERVAL": 600}):
        instance_id = sv.start_workflow(waits_for_go)
        results: list[sv.WorkflowResult] = []
        thread = threading.Thread(
            target=lambda: results.append(asyncio.run(sv.await_workflow(instance_id, 60))),
            daemon=True,
        )
        thread.start()
        # The awaiter listens for the instance's close on the in-process bus.
        wait_until(lambda: operations._store().bus.subscribed(f"closed:{instance_id}"))
        sv.signal(instance_id, "go", "now")
        thread.join(timeout=30)

    assert not thread.is_alive(), "await_workflow was not woken by the close"
    (result,) = results
    assert (result.status, result.output) == ("completed", "now")
    assert not operations._store().bus.subscribed(f"closed:{instance_id}")


def test_await_workflow_times_out_like_wait_workflow(worker: Any) -> None:
    instance_id = sv.start_workflow(waits_for_go)
    with pytest.raises(TimeoutError, match="still running"):
        asyncio.run(sv.await_workflow(instance_id, timeout=0.2))
    assert not operations._store().bus.subscribed(f"closed:{instance_id}")
    sv.signal(instance_id, "go", None)
