"""Idempotent starts and signals, signal-with-start, heartbeat details and progress.

The racing tests run real threads, each on its own database connection, released
together by a barrier: the database's unique keys, not a read before the write,
must make the outcome exactly one instance and each keyed signal once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction

import selvedge_django as sv
from selvedge_django.models import ActivityTask, SignalMessage, WorkflowInstance
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import Ledger

RACERS = 8
T = TypeVar("T")


@sv.workflow(name="test.idem.collect")
def collect(ctx: sv.WorkflowContext, data: dict[str, Any]) -> list[Any]:
    """Receive ``n`` signals on ``add``, reporting the count as progress; return them."""
    received: list[Any] = []
    ctx.set_progress({"received": 0})
    for _ in range(data["n"]):
        received.append(ctx.receive("add"))
        ctx.set_progress({"received": len(received)})
    return sorted(received, key=json.dumps)


@sv.workflow(name="test.idem.other")
def other(ctx: sv.WorkflowContext, data: Any) -> Any:
    return data


def race(fn: Callable[[int], Any], n: int = RACERS) -> list[Any]:
    """Run ``fn(i)`` on ``n`` threads released at once; return results (or exceptions)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = fn(i)
        except Exception as error:  # reported by the test's assertions
            results[i] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


def arun(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine like an async view would, closing its thread's connection after."""

    async def main() -> T:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def signal_rows(iid: str) -> list[tuple[str, str | None]]:
    rows = SignalMessage.objects.filter(instance_id=iid).order_by("id")
    return list(rows.values_list("payload", "idempotency_key"))


# -- start_workflow(if_exists="return") --------------------------------------------------


def test_racing_starts_with_if_exists_return_make_exactly_one_instance(tdb: None) -> None:
    started: list[str] = []

    class Hooks(sv.hooks.WorkflowHooks):
        def on_workflow_started(self, event: Any) -> None:
            started.append(event.instance_id)

    from django.test import override_settings

    with override_settings(SELVEDGE={**_settings(), "HOOKS": Hooks()}):
        results = race(
            lambda i: sv.start_workflow(
                collect, {"n": i}, instance_id="order-1", if_exists="return"
            )
        )
    assert results == ["order-1"] * RACERS
    assert WorkflowInstance.objects.filter(instance_id="order-1").count() == 1
    assert started == ["order-1"]  # one start happened; the others found it


def _settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.SELVEDGE)


def test_racing_starts_without_if_exists_let_one_win_and_the_others_raise(tdb: None) -> None:
    results = race(lambda i: sv.start_workflow(collect, {"n": i}, instance_id="order-2"))
    assert results.count("order-2") == 1
    errors = [r for r in results if r != "order-2"]
    assert len(errors) == RACERS - 1
    assert all(isinstance(e, sv.WorkflowAlreadyStarted) for e in errors), errors


def test_if_exists_return_returns_a_closed_instance_and_refuses_another_workflow(
    tdb: None,
) -> None:
    iid = sv.start_workflow(collect, {"n": 0}, instance_id="done-1")
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).status == "completed"
    # Running or closed, the instance is returned as it is: nothing written, not rerun.
    assert sv.start_workflow(collect, {"n": 5}, instance_id=iid, if_exists="return") == iid
    assert WorkflowInstance.objects.get(instance_id=iid).input == {"n": 0}
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflow(other, 1, instance_id=iid, if_exists="return")
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflow(collect, {"n": 0}, instance_id=iid)
    with pytest.raises(sv.WorkflowStartRejected, match="if_exists"):
        sv.start_workflow(collect, {"n": 0}, instance_id="x", if_exists="replace")  # type: ignore[arg-type]
    assert not WorkflowInstance.objects.filter(instance_id="x").exists()


def test_if_exists_return_inside_a_caller_transaction_keeps_it_usable(tdb: None) -> None:
    sv.start_workflow(collect, {"n": 0}, instance_id="tx-1")
    with transaction.atomic():
        assert sv.start_workflow(collect, {"n": 0}, instance_id="tx-1", if_exists="return")
        Ledger.objects.create(entry="after the start")  # the transaction is not aborted
    assert Ledger.objects.filter(entry="after the start").exists()


def test_astart_workflow_takes_if_exists(tdb: None) -> None:
    async def main() -> tuple[str, str]:
        first = await sv.astart_workflow(collect, {"n": 0}, instance_id="a-1", if_exists="return")
        again = await sv.astart_workflow(collect, {"n": 0}, instance_id="a-1", if_exists="return")
        return first, again

    assert arun(main()) == ("a-1", "a-1")
    assert WorkflowInstance.objects.filter(instance_id="a-1").count() == 1


# -- signal(idempotency_key=...) ---------------------------------------------------------


def test_racing_signals_with_one_key_write_one_inbox_row(tdb: None) -> None:
    iid = sv.start_workflow(collect, {"n": 2})
    results = race(lambda i: sv.signal(iid, "add", i, idempotency_key="payment-7"))
    assert results == [None] * RACERS  # every sender is told it was accepted
    rows = signal_rows(iid)
    assert len(rows) == 1 and rows[0][1] == "payment-7"
    sv.signal(iid, "add", "other", idempotency_key="payment-8")
    sv.signal(iid, "add", "unkeyed")
    sv.signal(iid, "add", "unkeyed")  # no key: never deduplicated
    assert len(signal_rows(iid)) == 4
    run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert result.status == "completed"
    assert "other" in result.output and len(result.output) == 2


def test_a_repeated_key_does_not_wake_a_waiting_instance(tdb: None) -> None:
    iid = sv.start_workflow(collect, {"n": 2})
    worker = Worker()
    run_until_idle(worker)  # waiting for its first signal
    sv.signal(iid, "add", 1, idempotency_key="k")
    assert WorkflowInstance.objects.get(instance_id=iid).runnable
    run_until_idle(worker)  # consumed it; waiting again, not runnable
    assert not WorkflowInstance.objects.get(instance_id=iid).runnable
    sv.signal(iid, "add", 1, idempotency_key="k")
    instance = WorkflowInstance.objects.get(instance_id=iid)
    assert not instance.runnable  # no second wake-up
    assert len(signal_rows(iid)) == 1
    # The key belongs to the instance: another instance takes the same key.
    second = sv.start_workflow(collect, {"n": 1})
    sv.signal(second, "add", 2, idempotency_key="k")
    assert len(signal_rows(second)) == 1


def test_a_keyed_signal_to_a_closed_or_unknown_instance_raises_and_a_bad_key_is_refused(
    tdb: None,
) -> None:
    iid = sv.start_workflow(collect, {"n": 1})
    sv.signal(iid, "add", 1, idempotency_key="k")
    run_until_idle(Worker())
    with pytest.raises(sv.WorkflowAlreadyCompleted):
        sv.signal(iid, "add", 1, idempotency_key="k")
    with pytest.raises(sv.WorkflowAlreadyCompleted):
        sv.signal(iid, "add", 1, idempotency_key="new")
    with pytest.raises(sv.WorkflowNotFound):
        sv.signal("nobody", "add", 1, idempotency_key="k")
    running = sv.start_workflow(collect, {"n": 1})
    for bad in ["", "x" * 256, "line\nbreak", 7]:
        with pytest.raises(sv.InvalidSignalPayload, match="idempotency_key"):
            sv.signal(running, "add", 1, idempotency_key=bad)  # type: ignore[arg-type]
    assert signal_rows(running) == []
    assert len(signal_rows(iid)) == 1


def test_a_keyed_signal_over_the_pending_limit_is_refused(tdb: None) -> None:
    from django.test import override_settings

    iid = sv.start_workflow(collect, {"n": 3})
    with override_settings(SELVEDGE={**_settings(), "MAX_PENDING_SIGNALS": 1}):
        sv.signal(iid, "add", 1, idempotency_key="a")
        sv.signal(iid, "add", 1, idempotency_key="a")  # a repeat is still a no-op
        with pytest.raises(sv.InboxFull):
            sv.signal(iid, "add", 2, idempotency_key="b")
    assert [key for _, key in signal_rows(iid)] == ["a"]


def test_racing_signals_never_overshoot_the_pending_limit(tdb: None) -> None:
    # Unkeyed signals sent together to one instance, its inbox almost full: the count
    # is taken at the instance row's lock, so exactly the room left is filled (on
    # PostgreSQL the one-statement signal gives way to the transaction when another
    # sender changed the row since its snapshot).
    from django.test import override_settings

    for round_ in range(3):
        iid = sv.start_workflow(collect, {"n": 20})
        with override_settings(SELVEDGE={**_settings(), "MAX_PENDING_SIGNALS": 3}):
            sv.signal(iid, "add", "first")
            results = race(lambda i, iid=iid: sv.signal(iid, "add", i))  # type: ignore[misc]
        refused = [r for r in results if r is not None]
        assert all(isinstance(r, sv.InboxFull) for r in refused), results
        assert (len(signal_rows(iid)), len(refused)) == (3, RACERS - 2), round_


def test_a_signal_outside_a_transaction_is_one_statement_on_postgresql(tdb: None) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite appends a signal in a transaction of its own")
    iid = sv.start_workflow(collect, {"n": 2})
    statements: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        sv.signal(iid, "add", 1)
    assert len(statements) == 1 and "INSERT INTO" in statements[0], statements
    assert not connection.in_atomic_block

    # Committed with its wake-up: another connection sees both.
    def seen() -> tuple[int, bool]:
        try:
            return (
                SignalMessage.objects.filter(instance_id=iid).count(),
                WorkflowInstance.objects.get(instance_id=iid).runnable,
            )
        finally:
            connection.close()

    assert race(lambda i: seen(), n=1) == [(1, True)]
    # Closed and unknown instances still raise their errors, with nothing written.
    with pytest.raises(sv.WorkflowNotFound):
        sv.signal("nobody", "add", 1)
    sv.signal(iid, "add", 2)
    run_until_idle(Worker())
    with pytest.raises(sv.WorkflowAlreadyCompleted):
        sv.signal(iid, "add", 3)
    assert len(signal_rows(iid)) == 2


# -- signal_with_start -------------------------------------------------------------------


def test_racing_signal_with_start_makes_one_instance_and_delivers_every_signal_once(
    tdb: None,
) -> None:
    results = race(
        lambda i: sv.signal_with_start(
            collect, {"n": RACERS}, instance_id="cart-1", channel="add", payload=i
        )
    )
    assert results == ["cart-1"] * RACERS
    assert WorkflowInstance.objects.filter(instance_id="cart-1").count() == 1
    assert sorted(json.loads(p) for p, _ in signal_rows("cart-1")) == list(range(RACERS))
    run_until_idle(Worker())
    result = sv.get_workflow_result("cart-1")
    assert (result.status, result.output) == ("completed", list(range(RACERS)))


def test_racing_signal_with_start_with_one_key_delivers_it_once(tdb: None) -> None:
    results = race(
        lambda i: sv.signal_with_start(
            collect,
            {"n": 1},
            instance_id="cart-2",
            channel="add",
            payload=i,
            idempotency_key="checkout",
        )
    )
    assert results == ["cart-2"] * RACERS
    assert len(signal_rows("cart-2")) == 1


def test_signal_with_start_refusals_write_nothing(tdb: None) -> None:
    with pytest.raises(sv.InvalidSignalPayload):
        sv.signal_with_start(collect, {"n": 1}, instance_id="s-1", channel="add", payload={1, 2})
    with pytest.raises(sv.InvalidSignalChannel):
        sv.signal_with_start(collect, {"n": 1}, instance_id="s-1", channel="", payload=1)
    with pytest.raises(sv.WorkflowStartRejected):
        sv.signal_with_start(collect, {1, 2}, instance_id="s-1", channel="add", payload=1)
    assert not WorkflowInstance.objects.filter(instance_id="s-1").exists()
    sv.start_workflow(other, 1, instance_id="s-2")
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.signal_with_start(collect, {"n": 1}, instance_id="s-2", channel="add", payload=1)
    run_until_idle(Worker())
    assert sv.get_workflow_result("s-2").status == "completed"
    with pytest.raises(sv.WorkflowAlreadyCompleted):
        sv.signal_with_start(other, 1, instance_id="s-2", channel="add", payload=1)
    assert signal_rows("s-2") == []


def test_signal_with_start_rolls_back_with_the_caller(tdb: None) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        sv.signal_with_start(collect, {"n": 1}, instance_id="s-3", channel="add", payload=1)
        raise RuntimeError("the caller's view failed")
    assert not WorkflowInstance.objects.filter(instance_id="s-3").exists()
    assert signal_rows("s-3") == []


def test_asignal_with_start_and_asignal_take_the_same_arguments(tdb: None) -> None:
    async def main() -> str:
        iid = await sv.asignal_with_start(
            collect, {"n": 2}, instance_id="as-1", channel="add", payload=1
        )
        await sv.asignal(iid, "add", 2, idempotency_key="k")
        await sv.asignal(iid, "add", 2, idempotency_key="k")
        return iid

    iid = arun(main())
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == [1, 2]


# -- heartbeat details -------------------------------------------------------------------


def test_heartbeat_details_reach_the_next_attempt_and_the_task_list(
    tdb: None, make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    marker = tmp_path / "hold"
    marker.touch()
    iid = sv.start_workflow(
        "act.run",
        {
            "activity": "act.wait",
            "input": {
                "tag": "hbd",
                "hold_while": str(marker),
                "hold_on": [1],
                "fail_on": [1],
                "details": True,
            },
            "options": {"retry_policy": {"max_attempts": 3, "initial_interval": 0.05}},
        },
    )
    make_worker()

    def stored() -> Any:
        task = ActivityTask.objects.filter(instance_id=iid).first()
        return task is not None and task.heartbeat_details

    details = json.loads(wait_until(stored))
    assert details["attempt"] == 1 and details["beats"] >= 1
    (info,) = sv.list_activity_tasks(iid)
    assert info.heartbeat_details["attempt"] == 1
    assert info.to_json()["heartbeat_details"] == info.heartbeat_details
    marker.unlink()  # attempt 1 fails; attempt 2 starts from its last stored details
    result = sv.wait_workflow(iid, timeout=30)
    assert (result.status, result.output) == ("completed", "hbd:2")
    (entry,) = Ledger.objects.filter(entry__startswith="wait:hbd:2:from:")
    handed = json.loads(entry.entry.removeprefix("wait:hbd:2:from:"))
    assert handed["attempt"] == 1 and handed["beats"] >= details["beats"]
    first = Ledger.objects.get(entry__startswith="wait:hbd:1:from:")
    assert first.entry == "wait:hbd:1:from:null"


def test_heartbeat_details_must_be_small_json(tdb: None) -> None:
    from selvedge_django.engine.activity import ActivityInfo, AttemptState, attempt_scope

    info = ActivityInfo("i", "w", "k", "a", 1, sv.ActivityOptions())
    state = AttemptState(info)
    with attempt_scope(state):
        sv.heartbeat({"ok": 1})
        with pytest.raises(TypeError):
            sv.heartbeat({1, 2})
        with pytest.raises(sv.PayloadTooLarge, match="heartbeat details"):
            sv.heartbeat("x" * 70_000)
        sv.heartbeat()  # no details: the last ones stay
    assert state.details == '{"ok":1}' and state.progress == 2


# -- progress ----------------------------------------------------------------------------


def test_progress_is_readable_while_running_and_replay_writes_nothing(tdb: None) -> None:
    iid = sv.start_workflow(collect, {"n": 2})
    assert sv.describe(iid).progress is None
    writes: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "SET progress" in sql:
            writes.append(params["progress"])
        return execute(sql, params, many, context)

    worker = Worker()
    with connection.execute_wrapper(spy):
        run_until_idle(worker)
        assert sv.describe(iid).progress == {"received": 0}
        assert sv.describe(iid).status == "running"
        sv.signal(iid, "add", "a")
        run_until_idle(worker)  # replays set_progress(0): only the new value is written
        assert sv.describe(iid).progress == {"received": 1}
        sv.signal(iid, "add", "b")
        run_until_idle(worker)
    assert writes == ['{"received":0}', '{"received":1}', '{"received":2}']
    description = sv.describe(iid)
    assert (description.status, description.progress) == ("completed", {"received": 2})
    assert description.to_json()["progress"] == {"received": 2}
    # A query replays the workflow: it writes no progress either.
    assert sv.find_instances(instance_id=iid).instances[0].progress == {"received": 2}


def test_progress_with_a_live_worker_thread(tdb: None, worker: Worker) -> None:
    iid = sv.start_workflow(collect, {"n": 1})
    wait_until(lambda: sv.describe(iid).progress == {"received": 0})
    sv.signal(iid, "add", 1)
    assert sv.wait_workflow(iid, timeout=20).status == "completed"
    assert sv.describe(iid).progress == {"received": 1}


@sv.workflow(name="test.idem.bad_progress")
def bad_progress(ctx: sv.WorkflowContext, value: str) -> str:
    try:
        ctx.set_progress({1, 2} if value == "set" else "x" * 70_000)
    except (TypeError, sv.PayloadTooLarge) as error:
        return type(error).__name__
    return "stored"


@pytest.mark.parametrize(("value", "error"), [("set", "TypeError"), ("big", "PayloadTooLarge")])
def test_a_bad_progress_value_raises_in_the_workflow_and_stores_nothing(
    tdb: None, value: str, error: str
) -> None:
    iid = sv.start_workflow(bad_progress, value)
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == error
    assert sv.describe(iid).progress is None


def test_a_failed_attempt_hands_its_latest_details_to_the_retry(tdb: None, tmp_path: Path) -> None:
    # Attempt 1 heartbeats for a moment, then fails before any renewal: the retry's
    # update stores its latest details, so attempt 2 starts from them.
    marker = tmp_path / "hold"
    marker.touch()
    iid = sv.start_workflow(
        "act.run",
        {
            "activity": "act.wait",
            "input": {
                "tag": "hbr",
                "hold_while": str(marker),
                "hold_on": [1],
                "max_hold": 0.05,
                "fail_on": [1],
                "details": True,
            },
            "options": {"retry_policy": {"max_attempts": 2, "initial_interval": 0.01}},
        },
    )
    # (The retry waits out its 10 ms backoff: run the loops until the run closes.)
    wait_until(lambda: run_until_idle(Worker()) == 0 and sv.describe(iid).status != "running")
    result = sv.get_workflow_result(iid)
    assert (result.status, result.output) == ("completed", "hbr:2"), result.error
    (task,) = sv.list_activity_tasks(iid)
    beats = int(str(task.last_error).rsplit(" after ", 1)[1].split()[0])
    assert beats >= 1
    (entry,) = Ledger.objects.filter(entry__startswith="wait:hbr:2:from:")
    handed = json.loads(entry.entry.removeprefix("wait:hbr:2:from:"))
    assert handed == {"attempt": 1, "beats": beats}


def test_a_fork_keeps_the_idempotency_keys_of_the_signals_it_copies(tdb: None) -> None:
    iid = sv.start_workflow(collect, {"n": 2})
    sv.signal(iid, "add", 1, idempotency_key="k")
    run_until_idle(Worker())
    sv.terminate_workflow(iid)
    fork = sv.fork_workflow(iid)
    sv.signal(fork, "add", 1, idempotency_key="k")  # already delivered to the copy
    assert signal_rows(fork) == [("1", "k")]
