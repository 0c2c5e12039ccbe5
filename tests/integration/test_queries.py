"""Queries: ``ctx.set_query_handler()`` and ``sv.query()`` on the real test database.

A query takes one snapshot, replays the workflow from the start, stops before
the first unrecorded command or blocking wait (or at the close) and runs the
handler there. It takes no lease, writes nothing and fires no hooks. Instances
are driven with ``run_until_idle`` on a controllable clock, so every position a
query can stop at is reached exactly.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.hooks import HOOK_NAMES, WorkflowHooks
from selvedge_django.models import HistoryEvent, SignalMessage, WorkflowInstance
from selvedge_django.operations import _store
from selvedge_django.signals import workflow_completed
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests import ops_workflows

# -- workflows ------------------------------------------------------------------------------


@sv.activity(name="ops.q.unserved", queue="ops-q-unserved")
def unserved(value: Any) -> Any:
    """Queued on a queue no worker in these tests serves."""
    return value


@sv.workflow(name="ops.q.counter")
def counter(ctx: sv.WorkflowContext, _: Any) -> int:
    """Count "inc" signals until "stop"; the handlers change at the close."""
    state: dict[str, Any] = {"count": 0, "seen": []}
    ctx.set_query_handler("count", lambda: state["count"])
    ctx.set_query_handler("seen", lambda: list(state["seen"]))
    while True:
        value = ctx.receive("inc")
        if value == "stop":
            break
        state["count"] += 1
        state["seen"].append(value)
    ctx.set_query_handler("count", lambda: -state["count"])  # replaces the first one
    ctx.set_query_handler("seen", None)  # removes it
    count: int = state["count"]
    return count


@sv.workflow(name="ops.q.views")
def views(ctx: sv.WorkflowContext, _: Any) -> str:
    """Handlers reading the delivered view: pending signals and activity readiness."""
    manual = unserved.execute_async(ctx, "m")
    ctx.set_query_handler("pending", lambda: ctx.pending("c"))
    ctx.set_query_handler("manual_ready", manual.is_ready)
    ctx.receive("go")
    ctx.set_query_handler("after_go", lambda: "past the first go")
    ctx.receive("go")
    return "done"


@sv.workflow(name="ops.q.stops")
def stops(ctx: sv.WorkflowContext, _: Any) -> str:
    """Handlers registered before and after an unfinished activity."""
    ctx.set_query_handler("before", lambda: "before the activity")
    unserved.execute(ctx, "wait here")
    ctx.set_query_handler("after", lambda: "after the activity")
    return "done"


class Boom(Exception):
    """Raised by a query handler."""


@sv.workflow(name="ops.q.handlers")
def handlers(ctx: sv.WorkflowContext, _: Any) -> str:
    """Handlers that fail, issue commands or answer with values that are not JSON."""

    def boom() -> Any:
        raise Boom("the handler broke")

    ctx.set_query_handler("boom", boom)
    ctx.set_query_handler("lookup", lambda: {}["missing"])
    ctx.set_query_handler("set", lambda: {1, 2})
    ctx.set_query_handler("now", ctx.now)
    ctx.set_query_handler("sleep", lambda: ctx.sleep(1))
    ctx.set_query_handler("receive", lambda: ctx.receive("go"))
    ctx.set_query_handler("activity", lambda: unserved.execute(ctx, "from a query"))
    ctx.set_query_handler("child", lambda: ctx.start_child(ops_workflows.echo, 1))
    ctx.set_query_handler("register", lambda: ctx.set_query_handler("x", lambda: 1))
    ctx.set_query_handler("wait_condition", lambda: ctx.wait_condition(lambda: True))
    ctx.set_query_handler("receive_async", lambda: ctx.receive_async("go"))
    _, cancel = ctx.with_cancel()
    ctx.set_query_handler("cancel_scope", cancel)
    priced = ops_workflows.price.execute_async(ctx, {"sku": "hat", "quantity": 1})
    ctx.set_query_handler("future_get", lambda: priced.get(ctx))
    ctx.set_query_handler(
        "shapes",
        lambda: {
            "pair": (1, 2),
            "when": dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            "price": Decimal("9.99"),
            "by_number": {1: "one"},
        },
    )
    ctx.set_query_handler("none", lambda: None)
    ctx.set_query_handler("é" * 127 + "x", lambda: "the longest name: 255 bytes")
    return ctx.receive("go")


@sv.workflow(name="ops.q.names")
def names(ctx: sv.WorkflowContext, _: Any) -> list[str]:
    """Register handlers with bad names and values; report what was raised."""
    errors = []
    for name, handler in (("", lambda: 1), ("x" * 256, lambda: 1), (7, lambda: 1), ("ok", 3)):
        try:
            ctx.set_query_handler(name, handler)  # type: ignore[arg-type]
        except (ValueError, TypeError) as error:
            errors.append(type(error).__name__)
    ctx.set_query_handler("ok", lambda: "registered")
    ctx.set_query_handler("gone", lambda: 1)
    ctx.set_query_handler("gone", None)
    ctx.set_query_handler("never-there", None)  # removing an absent handler is fine
    return errors


@sv.workflow(name="ops.q.in_predicate")
def in_predicate(ctx: sv.WorkflowContext, _: Any) -> str:
    def predicate() -> bool:
        ctx.set_query_handler("sneaky", lambda: 1)
        return True

    ctx.wait_condition(predicate)
    return "returned"


# -- fixtures and helpers ----------------------------------------------------------------


class Recorder(WorkflowHooks):
    """Every callback appends its name."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in HOOK_NAMES:
            return lambda event: object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def stepper(clock: ControllableClock) -> Worker:
    """An unstarted Worker that never serves the ops-q-unserved queue."""
    return Worker(activity_queues=[""])


@pytest.fixture
def scratch() -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    saved: dict[str, Any] = {}

    def define(name: str, fn: Callable[..., Any]) -> None:
        if name not in saved:
            saved[name] = registry.get_workflow(name)
        registry.unregister(name, kind="workflow")
        sv.workflow(name=name)(fn)

    yield define
    for name, original in saved.items():
        registry.unregister(name, kind="workflow")
        if original is not None:
            sv.workflow(name=name)(original.fn)


def arun(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine like an async view would, closing its thread's connection after."""

    async def main() -> Any:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def durable_state(instance_id: str) -> list[Any]:
    """Everything a query must leave untouched."""
    inst = WorkflowInstance.objects.values().get(instance_id=instance_id)
    events = list(HistoryEvent.objects.filter(instance_id=instance_id).order_by("id").values())
    sigs = list(SignalMessage.objects.filter(instance_id=instance_id).order_by("id").values())
    return [inst, events, sigs]


WRITES = re.compile(r"^\s*(INSERT|UPDATE|DELETE|SELECT .* FOR UPDATE)", re.IGNORECASE | re.DOTALL)


# -- answers at the replay position ---------------------------------------------------------


def test_a_query_answers_where_replay_stops(stepper: Worker) -> None:
    iid = sv.start_workflow(counter)
    assert sv.query(iid, "count") == 0  # never dispatched: replay stops at the first receive
    run_until_idle(stepper)
    assert sv.query(iid, "count") == 0
    sv.signal(iid, "inc", "a")
    run_until_idle(stepper)
    assert (sv.query(iid, "count"), sv.query(iid, "seen")) == (1, ["a"])
    sv.signal(iid, "inc", "b")  # arrived, not yet consumed by an execution
    assert sv.query(iid, "count") == 1
    run_until_idle(stepper)
    assert (sv.query(iid, "count"), sv.query(iid, "seen")) == (2, ["a", "b"])


def test_a_closed_instance_answers_with_the_handlers_registered_at_its_close(
    stepper: Worker,
) -> None:
    iid = sv.start_workflow(counter)
    run_until_idle(stepper)
    for value in ("a", "b", "c", "stop"):
        sv.signal(iid, "inc", value)
    run_until_idle(stepper)
    assert sv.get_workflow_result(iid).output == 3
    assert sv.query(iid, "count") == -3  # the replacement registered before returning
    with pytest.raises(sv.QueryNotFound) as caught:
        sv.query(iid, "seen")  # removed with None
    assert caught.value.name == "seen"
    assert isinstance(caught.value, LookupError)


def test_failed_and_cancelled_instances_answer_queries(stepper: Worker) -> None:
    failed = sv.start_workflow("ops.golden.order", {"sku": "tee", "quantity": 1})
    cancelled = sv.start_workflow("ops.golden.order", {"sku": "hat", "quantity": 2})
    run_until_idle(stepper)
    sv.signal(failed, "approve", {"by": "bob", "reject": True})
    sv.cancel_workflow(cancelled, "changed my mind")
    run_until_idle(stepper)
    assert (sv.describe(failed).status, sv.describe(cancelled).status) == ("failed", "cancelled")
    assert sv.query(failed, "stage") == "awaiting approval"
    assert sv.query(cancelled, "stage") == "awaiting approval"


def test_handlers_read_the_delivered_view_at_the_replay_position(stepper: Worker) -> None:
    iid = sv.start_workflow(views)
    run_until_idle(stepper)
    sv.signal(iid, "c", "first")  # an arrival: invisible until a receive delivers it
    assert (sv.query(iid, "pending"), sv.query(iid, "manual_ready")) == (0, False)
    store = _store()
    (row,) = HistoryEvent.objects.filter(instance_id=iid, command="activity")
    claimed = store.claim_task(iid, row.key, "another-worker")
    assert claimed is not None and store.tasks.complete_task(claimed.claim, '"done elsewhere"')
    assert sv.query(iid, "manual_ready") is False  # arrived, still undelivered
    with pytest.raises(sv.QueryNotFound):
        sv.query(iid, "after_go")

    sv.signal(iid, "go")
    run_until_idle(stepper)  # the receive of "go" delivers the signal and the result
    assert sv.query(iid, "pending") == 1
    assert sv.query(iid, "manual_ready") is True
    assert sv.query(iid, "after_go") == "past the first go"


def test_replay_stops_before_the_first_unrecorded_command_or_blocking_wait(
    stepper: Worker,
) -> None:
    iid = sv.start_workflow(stops)
    run_until_idle(stepper)  # the activity is reserved on a queue nobody serves
    assert sv.query(iid, "before") == "before the activity"
    with pytest.raises(sv.QueryNotFound):
        sv.query(iid, "after")

    store = _store()
    (row,) = HistoryEvent.objects.filter(instance_id=iid, command="activity")
    claimed = store.claim_task(iid, row.key, "another-worker")
    assert claimed is not None and store.tasks.complete_task(claimed.claim, '"served"')
    # The recorded outcome lets replay pass the get, as the next execution will.
    assert sv.query(iid, "after") == "after the activity"


def test_a_later_query_can_reach_a_later_position(stepper: Worker) -> None:
    iid = sv.start_workflow("ops.golden.order", {"sku": "tee", "quantity": 3})
    assert sv.query(iid, "stage") == "pricing"  # nothing recorded yet
    run_until_idle(stepper)
    assert sv.query(iid, "stage") == "awaiting approval"
    sv.signal(iid, "approve", {"by": "ada"})
    run_until_idle(stepper)
    assert sv.query(iid, "stage") == "cooling off"


# -- no lease, no writes, no hooks ------------------------------------------------------------


def test_a_query_takes_no_lease_writes_nothing_and_fires_no_hooks(clock: ControllableClock) -> None:
    recorder = Recorder()
    completed: list[Any] = []

    def on_completed(sender: Any, **kwargs: Any) -> None:
        completed.append(kwargs)

    workflow_completed.connect(on_completed, weak=False)
    try:
        worker = Worker(hooks=recorder)
        running = sv.start_workflow("ops.golden.order", {"sku": "tee", "quantity": 3})
        closed = sv.start_workflow(ops_workflows.echo, "x")
        run_until_idle(worker)
        calls, signals_sent = list(recorder.calls), len(completed)
        assert "on_activity_completed" in calls and signals_sent == 1
        before = [durable_state(running), durable_state(closed)]
        with (
            override_settings(SELVEDGE={"HOOKS": recorder}),
            CaptureQueriesContext(connection) as captured,
        ):
            assert sv.query(running, "stage") == "awaiting approval"  # replays an activity
            with pytest.raises(sv.QueryNotFound):
                sv.query(closed, "anything")
        assert [durable_state(running), durable_state(closed)] == before
        assert not [q["sql"] for q in captured.captured_queries if WRITES.match(q["sql"])]
        assert recorder.calls == calls and len(completed) == signals_sent
    finally:
        workflow_completed.disconnect(on_completed)


def test_a_query_answers_while_another_execution_holds_the_lease(stepper: Worker) -> None:
    iid = sv.start_workflow(counter)
    run_until_idle(stepper)
    sv.signal(iid, "inc", "a")  # runnable again: another worker leases it
    fence = _store().instances.acquire(iid, "another-worker", ttl=60)
    assert fence is not None
    held = WorkflowInstance.objects.values("lease_owner", "lease_epoch").get(instance_id=iid)
    assert sv.query(iid, "count") == 0
    assert (
        WorkflowInstance.objects.values("lease_owner", "lease_epoch").get(instance_id=iid) == held
    )


# -- failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cause"),
    [("boom", Boom), ("lookup", KeyError), ("set", TypeError)],
)
def test_handler_errors_and_unencodable_answers_are_query_failed(
    stepper: Worker, name: str, cause: type[BaseException]
) -> None:
    iid = sv.start_workflow(handlers)
    run_until_idle(stepper)
    with pytest.raises(sv.QueryFailed) as caught:
        sv.query(iid, name)
    assert caught.value.name == name
    assert isinstance(caught.value.error, cause)
    assert caught.value.__cause__ is caught.value.error


@pytest.mark.parametrize(
    "name",
    [
        "now",
        "sleep",
        "receive",
        "activity",
        "child",
        "register",
        "wait_condition",
        "receive_async",
        "cancel_scope",
        "future_get",
    ],
)
def test_commands_in_a_handler_fail_only_the_query(stepper: Worker, name: str) -> None:
    iid = sv.start_workflow(handlers)
    run_until_idle(stepper)
    before = durable_state(iid)
    with pytest.raises(sv.QueryCommandError):
        sv.query(iid, name)
    assert durable_state(iid) == before
    assert sv.query(iid, "none") is None  # the next query is unaffected
    sv.signal(iid, "go", "finished")
    run_until_idle(stepper)
    assert sv.get_workflow_result(iid).output == "finished"  # and so is the workflow


def test_answers_pass_through_json(stepper: Worker) -> None:
    iid = sv.start_workflow(handlers)
    run_until_idle(stepper)
    assert sv.query(iid, "shapes") == {
        "pair": [1, 2],
        "when": "2030-01-02T03:04:05Z",
        "price": "9.99",
        "by_number": {"1": "one"},
    }
    assert sv.query(iid, "é" * 127 + "x") == "the longest name: 255 bytes"


@pytest.mark.parametrize("name", ["", "x" * 256, "é" * 128, "missing"])
def test_unknown_and_invalid_names_are_query_not_found(stepper: Worker, name: str) -> None:
    iid = sv.start_workflow(handlers)
    run_until_idle(stepper)
    with pytest.raises(sv.QueryNotFound):
        sv.query(iid, name)


def test_unknown_instances_and_unregistered_workflows(tdb: None) -> None:
    with pytest.raises(sv.WorkflowNotFound):
        sv.query("no-such-instance", "count")
    iid = sv.start_workflow("ops.q.registered.nowhere")
    with pytest.raises(sv.WorkflowNotRegistered) as caught:
        sv.query(iid, "count")
    assert caught.value.workflow_name == "ops.q.registered.nowhere"


def test_a_replay_mismatch_is_the_original_replay_error(stepper: Worker, scratch: Any) -> None:
    iid = sv.start_workflow(counter)
    run_until_idle(stepper)
    sv.signal(iid, "inc", "a")
    run_until_idle(stepper)

    def changed(ctx: sv.WorkflowContext, data: Any) -> Any:
        ctx.now()  # a new first command
        return counter.fn(ctx, data)

    scratch("ops.q.counter", changed)
    with pytest.raises(sv.NondeterminismError) as caught:
        sv.query(iid, "count")
    assert (caught.value.expected, caught.value.actual) == ("receive", "now")


def test_async_query(stepper: Worker) -> None:
    iid = sv.start_workflow(counter)
    run_until_idle(stepper)
    sv.signal(iid, "inc", "a")
    run_until_idle(stepper)

    async def view() -> list[Any]:
        answers: list[Any] = [await sv.aquery(iid, "seen")]
        for name in ("missing",):
            try:
                await sv.aquery(iid, name)
            except sv.QueryNotFound as error:
                answers.append(type(error).__name__)
        return answers

    assert arun(view()) == [["a"], "QueryNotFound"]


# -- registering handlers ---------------------------------------------------------------


def test_registration_validates_names_and_records_nothing(stepper: Worker) -> None:
    iid = sv.start_workflow(names)
    run_until_idle(stepper)
    assert sv.get_workflow_result(iid).output == [
        "ValueError",
        "ValueError",
        "ValueError",
        "TypeError",
    ]
    assert [r.command for r in HistoryEvent.objects.filter(instance_id=iid)] == ["close"]
    assert sv.query(iid, "ok") == "registered"
    with pytest.raises(sv.QueryNotFound):
        sv.query(iid, "gone")


def test_registering_inside_a_predicate_fails_the_run(stepper: Worker) -> None:
    iid = sv.start_workflow(in_predicate)
    run_until_idle(stepper)
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert isinstance(result.error, sv.NondeterminismError)


# -- timeouts -----------------------------------------------------------------------------

REPLAYED: list[int] = []


@sv.workflow(name="ops.q.long")
def long_history(ctx: sv.WorkflowContext, steps: int) -> int:
    """Record ``steps`` observations, then wait; the replay notes every step it reaches."""
    REPLAYED.clear()
    ctx.set_query_handler("steps", lambda: len(REPLAYED))
    for n in range(steps):
        REPLAYED.append(n)
        ctx.now()
    return int(ctx.receive("go"))


def test_a_query_timeout_is_checked_at_command_boundaries(stepper: Worker) -> None:
    iid = sv.start_workflow(long_history, 200)
    run_until_idle(stepper)
    assert sv.query(iid, "steps", timeout=60) == 200
    # A timeout that has passed once the snapshot is read stops the replay at its first
    # command boundary: the handler never runs and the rest of the history is not replayed.
    with pytest.raises(sv.QueryTimeout) as caught:
        sv.query(iid, "steps", timeout=1e-9)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, sv.SelvedgeError)
    assert (caught.value.instance_id, caught.value.name) == (iid, "steps")
    assert iid in str(caught.value) and "steps" in str(caught.value)
    assert len(REPLAYED) <= 1
    assert sv.query(iid, "steps", timeout=dt.timedelta(minutes=1)) == 200


@sv.workflow(name="ops.q.spinning")
def spinning(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Wait for "go"; the handler "spin" never returns, "catching" catches what
    ``except Exception`` catches, "swallowing" catches the interruption and answers."""

    def spin() -> int:
        while True:
            pass

    def catching() -> int:
        while True:
            try:
                while True:
                    pass
            except Exception:  # a QueryTimeout would stop here; the interruption does not
                pass

    def swallowing() -> str:
        try:
            while True:
                pass
        except BaseException:
            return "too late"

    ctx.set_query_handler("spin", spin)
    ctx.set_query_handler("catching", catching)
    ctx.set_query_handler("swallowing", swallowing)
    ctx.set_query_handler("ready", lambda: "ready")
    return ctx.receive("go")


def ask_within(seconds: float, ask: Callable[[], Any]) -> list[Any]:
    """Run ``ask`` on a thread; poll until it returns or ``seconds`` pass; return what
    it returned or raised, and the thread's trace function before and after."""
    outcome: list[Any] = []

    def run() -> None:
        before = sys.gettrace()
        try:
            outcome.append(ask())
        except BaseException as error:
            outcome.append(error)
        finally:
            outcome.append((before, sys.gettrace()))
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.05)
    assert not thread.is_alive(), "the query is still running its handler"
    return outcome


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handler", ["spin", "catching", "swallowing"])
def test_a_query_timeout_interrupts_a_handler_that_never_returns(
    stepper: Worker, handler: str
) -> None:
    iid = sv.start_workflow(spinning)
    run_until_idle(stepper)
    started = time.monotonic()
    error, (before, after) = ask_within(15, lambda: sv.query(iid, handler, timeout=0.3))
    assert isinstance(error, sv.QueryTimeout), error
    assert (error.instance_id, error.name, error.timeout) == (iid, handler, 0.3)
    assert time.monotonic() - started >= 0.3
    assert after is before  # a tracer installed before (coverage, a debugger) is back
    # A previous trace function keeps seeing the calls while the handler is bounded.
    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            seen.append(frame.f_code.co_name)
        return None

    def traced() -> Any:
        sys.settrace(tracer)
        try:
            return sv.query(iid, handler, timeout=0.3)
        finally:
            sys.settrace(None)

    error, (before, after) = ask_within(15, traced)
    assert isinstance(error, sv.QueryTimeout), error
    assert handler in seen
    # Without a timeout nothing traces the handler; in time, the answer comes as before.
    assert ask_within(15, lambda: sv.query(iid, "ready", timeout=60))[0] == "ready"
    assert sv.query(iid, "ready") == "ready"


def test_an_async_query_takes_a_timeout(stepper: Worker) -> None:
    iid = sv.start_workflow(long_history, 50)
    run_until_idle(stepper)

    async def view() -> list[Any]:
        answers: list[Any] = [await sv.aquery(iid, "steps", timeout=60)]
        try:
            await sv.aquery(iid, "steps", timeout=1e-9)
        except sv.QueryTimeout as error:
            answers.append(type(error).__name__)
        return answers

    assert arun(view()) == [50, "QueryTimeout"]


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), ("5", TypeError)],
)
def test_a_query_timeout_must_be_a_positive_duration(
    stepper: Worker, timeout: Any, error: type[Exception]
) -> None:
    iid = sv.start_workflow(long_history, 1)
    with pytest.raises(error):
        sv.query(iid, "steps", timeout=timeout)
