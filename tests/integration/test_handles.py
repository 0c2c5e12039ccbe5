"""Typed workflow handles on a real database: start, result, signal, query, cancel, get_handle."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance
from tests.conftest import wait_until
from tests.integration.test_client import arun
from tests.testapp.workflows.basics import sum3

# -- workflows of these tests -----------------------------------------------------------


@sv.workflow(name="test.handles.collect")
def collect(ctx: sv.WorkflowContext, limit: int) -> list[str]:
    """Receive items on "item" until ``limit`` arrived; the "seen" query answers so far."""
    seen: list[str] = []
    ctx.set_query_handler("seen", lambda: list(seen))
    while len(seen) < limit:
        seen.append(ctx.receive("item"))
    return seen


@sv.workflow(name="test.handles.greet")
def greet(ctx: sv.WorkflowContext, _: None) -> str:
    return "hello"


@sv.workflow(name="test.handles.refuse")
def refuse(ctx: sv.WorkflowContext, code: int) -> int:
    raise sv.ApplicationError("refused", type="Refused", details={"code": code})


# -- start and result -------------------------------------------------------------------


def test_start_returns_a_handle_whose_result_is_the_output(worker: Any) -> None:
    handle = sum3.start({"a": 1, "b": 2, "c": 3})
    assert isinstance(handle, sv.WorkflowHandle)
    assert isinstance(handle.id, str) and handle.id
    assert handle.result(timeout=20) == 6
    assert handle.result() == 6  # a closed instance answers again
    description = handle.describe()
    assert (description.instance_id, description.workflow_name) == (handle.id, "test.sum3")
    assert description.status == sv.WorkflowStatus.COMPLETED


def test_start_of_a_workflow_without_input(worker: Any) -> None:
    assert greet.start().result(timeout=20) == "hello"


def test_start_takes_the_options_of_start_workflow(worker: Any) -> None:
    handle = collect.start(1, instance_id="collect-1", priority=7, execution_timeout=3600)
    assert handle.id == "collect-1"
    description = handle.describe()
    assert description.priority == 7
    assert description.execution_timeout is not None
    assert description.execution_timeout.total_seconds() == 3600
    with pytest.raises(sv.WorkflowAlreadyStarted):
        collect.start(1, instance_id="collect-1")
    assert collect.start(1, instance_id="collect-1", if_exists="return") == handle
    with pytest.raises(sv.WorkflowStartRejected):
        collect.start(1, priority=1000)
    assert WorkflowInstance.objects.count() == 1
    handle.signal("item", "only")
    assert handle.result(timeout=20) == ["only"]


def test_start_joins_the_callers_transaction(tdb: None) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        handle = collect.start(1, instance_id="rolled-back")
        raise RuntimeError("the view failed after the start")
    with pytest.raises(sv.WorkflowNotFound):
        handle.describe()


def test_result_raises_the_runs_error(worker: Any) -> None:
    handle = refuse.start(51)
    with pytest.raises(sv.ApplicationError) as info:
        handle.result(timeout=20)
    assert (info.value.type, info.value.message, info.value.details) == (
        "Refused",
        "refused",
        {"code": 51},
    )
    # The error is the one get_workflow_result carries.
    error = sv.get_workflow_result(handle.id).error
    assert isinstance(error, sv.ApplicationError) and error.details == {"code": 51}


def test_result_times_out_while_running(tdb: None) -> None:
    handle = collect.start(1)  # no worker runs it
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.2)


# -- signal, query, cancel --------------------------------------------------------------


def test_signal_and_query_through_the_handle(worker: Any) -> None:
    handle = collect.start(2)
    handle.signal("item", "a")
    wait_until(lambda: handle.query("seen") == ["a"])
    handle.signal("item", "b", idempotency_key="b")
    handle.signal("item", "b again", idempotency_key="b")  # the same key: no second item
    assert handle.result(timeout=20) == ["a", "b"]
    assert handle.query("seen") == ["a", "b"]
    with pytest.raises(sv.QueryNotFound):
        handle.query("no-such-query")


def test_cancel_through_the_handle(worker: Any) -> None:
    handle = collect.start(5)
    handle.cancel(reason="no longer needed")
    with pytest.raises(sv.WorkflowCancelled):
        handle.result(timeout=20)
    description = handle.describe()
    assert description.status == sv.WorkflowStatus.CANCELLED
    assert (description.cancel_requested, description.cancel_reason) == (True, "no longer needed")
    handle.cancel()  # already cancelled: fine
    with pytest.raises(sv.InstanceClosed):
        handle.signal("item", "late")


# -- get_handle -------------------------------------------------------------------------


def test_get_handle_on_an_existing_instance(worker: Any) -> None:
    instance_id = sv.start_workflow(collect, 1, instance_id="existing")
    handle = sv.get_handle(instance_id, workflow=collect)
    assert (
        handle
        == sv.get_handle(instance_id)
        == collect.start(1, instance_id=instance_id, if_exists="return")
    )
    assert repr(handle) == "<WorkflowHandle 'existing'>"
    handle.signal("item", "x")
    assert handle.result(timeout=20) == ["x"]
    assert sv.get_handle(instance_id).result() == ["x"]


def test_get_handle_reads_nothing_and_unknown_ids_fail_at_first_use(tdb: None) -> None:
    handle = sv.get_handle("nobody-has-this-id")
    for call in (handle.describe, handle.result, lambda: handle.signal("c"), handle.cancel):
        with pytest.raises(sv.WorkflowNotFound):
            call()
    with pytest.raises(sv.WorkflowNotFound):
        sv.get_handle("")  # no instance can have it
    with pytest.raises(TypeError):
        sv.get_handle("x", workflow="test.handles.collect")  # type: ignore[call-overload]


# -- async twins ------------------------------------------------------------------------


def test_async_handle_calls(worker: Any) -> None:
    async def view() -> dict[str, Any]:
        handle = await collect.astart(2, instance_id="async-collect")
        await handle.asignal("item", "a")
        await handle.asignal("item", "b")
        result = await handle.aresult(timeout=20)
        cancelled = await collect.astart(3)
        await cancelled.acancel("stop")
        try:
            await cancelled.aresult(timeout=20)
        except sv.WorkflowCancelled as error:
            raised: BaseException | None = error
        else:
            raised = None
        return {
            "id": handle.id,
            "result": result,
            "seen": await handle.aquery("seen"),
            "description": await handle.adescribe(),
            "greeting": await (await greet.astart()).aresult(timeout=20),
            "raised": raised,
        }

    out = arun(view())
    assert out["id"] == "async-collect"
    assert out["result"] == out["seen"] == ["a", "b"]
    assert out["description"].status == "completed"
    assert out["greeting"] == "hello"
    assert isinstance(out["raised"], sv.WorkflowCancelled)
