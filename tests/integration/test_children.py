"""Child workflows on real databases: starts, ids, results, errors, readiness and cancellation.

Every test runs real worker threads against SQLite or PostgreSQL
(``SELVEDGE_TEST_DB``), or drives the ORM store directly; a child on another worker
process is tests/processes/test_child_processes.py's.
Waits poll the database with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.events import Fence, HistoryRow
from selvedge_django.engine.ports import ChildSpec
from selvedge_django.models import HistoryEvent, WorkflowInstance
from selvedge_django.storage import store_for
from tests.conftest import wait_until
from tests.testapp.models import Ledger
from tests.testapp.workflows import children as wf

# -- helpers ----------------------------------------------------------------------------


def instance(instance_id: str) -> WorkflowInstance:
    return WorkflowInstance.objects.get(instance_id=instance_id)


def parked(instance_id: str, after_epoch: int = 0) -> bool:
    """The instance ran (past ``after_epoch``), suspended and waits for input."""
    return WorkflowInstance.objects.filter(
        instance_id=instance_id,
        status="running",
        lease_owner="",
        runnable=False,
        lease_epoch__gt=after_epoch,
    ).exists()


def rows(instance_id: str, command: str | None = None) -> list[HistoryEvent]:
    qs = HistoryEvent.objects.filter(instance_id=instance_id)
    if command is not None:
        qs = qs.filter(command=command)
    return list(qs.order_by("id"))


def payload(event: HistoryEvent) -> Any:
    return json.loads(event.data) if event.data is not None else None


def child_of(parent_id: str, key: str) -> str:
    return f"{parent_id}/{key}"


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A file that ``child.hold`` waits on; removed after the test whatever happens."""
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


# -- 4. starting children ---------------------------------------------------------------


def test_children_get_default_or_explicit_ids_parent_links_and_their_results(worker: Any) -> None:
    parent = sv.start_workflow("child.basic", {"child_id": "child-explicit-b"})
    result = sv.wait_workflow(parent, timeout=20)
    assert result.status == "completed", result.error

    first, second = rows(parent, "child")
    default_id = child_of(parent, first.key)
    assert result.output == {
        "ids": [default_id, "child-explicit-b"],
        "keys": [first.key, second.key],
        "values": [
            {"echo": "a", "id": default_id},
            {"echo": "b", "id": "child-explicit-b"},
        ],
    }
    assert (first.seq, second.seq) == (1, 2)
    assert json.loads(first.reservation or "{}") == {
        "child_id": default_id,
        "workflow": "child.echo",
    }
    assert [(r.event_type, payload(r)["echo"]) for r in (first, second)] == [
        ("ChildCompleted", "a"),
        ("ChildCompleted", "b"),
    ]
    for child_id, key in ((default_id, first.key), ("child-explicit-b", second.key)):
        described = sv.describe(child_id)
        assert (described.parent_instance_id, described.parent_key) == (parent, key)
        assert (described.workflow_name, described.status) == ("child.echo", "completed")
        assert sv.get_workflow_result(child_id).output["id"] == child_id
    top = sv.describe(parent)
    assert (top.parent_instance_id, top.parent_key) == ("", "")
    sv.replay_instance(parent)


def test_a_child_start_commits_with_the_parents_command_in_one_fenced_transaction(
    tdb: None,
) -> None:
    store = store_for("default", Codec())
    parent = sv.start_workflow("child.store_only")
    fence = store.instances.acquire(parent, "owner-a", ttl=60)
    assert fence is not None
    reservation = json.dumps({"child_id": "child-fenced", "workflow": "child.store_only"})
    command = HistoryRow("#1:child:child.store_only", 1, "child", reservation=reservation)
    spec = ChildSpec("child-fenced", "child.store_only", {"n": 1})

    with pytest.raises(sv.Fenced):
        store.start_child(Fence(parent, "owner-a", fence.epoch - 1), command, spec)
    assert not WorkflowInstance.objects.filter(instance_id="child-fenced").exists()
    assert rows(parent) == []

    stored = store.start_child(fence, command, spec)
    assert (stored.key, stored.data) == (command.key, None)
    child = instance("child-fenced")
    assert (child.status, child.runnable, child.input) == ("running", True, {"n": 1})
    assert (child.parent_instance_id, child.parent_key) == (parent, command.key)
    assert [r.key for r in rows(parent)] == [command.key]


def test_a_duplicate_child_id_is_recorded_replayed_and_survivable(worker: Any) -> None:
    taken = sv.start_workflow("child.nobody_runs_this", instance_id="child-taken")
    parent = sv.start_workflow("child.duplicate", {"child_id": taken})
    wait_until(lambda: parked(parent))
    (failed,) = rows(parent, "child")
    assert failed.event_type == "ChildStartFailed"
    assert json.loads(failed.data or "{}")["type"] == "WorkflowAlreadyStarted"
    existing = sv.describe(taken)
    assert (existing.workflow_name, existing.parent_instance_id) == ("child.nobody_runs_this", "")

    sv.signal(parent, "go")  # the next run replays the recorded failure, then goes on
    result = sv.wait_workflow(parent, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == [["WorkflowAlreadyStarted", taken], "fresh"]
    assert [r.event_type for r in rows(parent, "child")] == ["ChildStartFailed", "ChildCompleted"]
    assert WorkflowInstance.objects.filter(parent_instance_id=parent).count() == 1
    sv.replay_instance(parent)


@pytest.mark.parametrize("mode", ["application", "plain"])
@pytest.mark.parametrize("catch", [True, False])
def test_a_child_failure_reaches_the_parent_with_the_childs_error_envelope(
    worker: Any, mode: str, catch: bool
) -> None:
    parent = sv.start_workflow("child.errors", {"mode": mode, "catch": catch})
    result = sv.wait_workflow(parent, timeout=20)
    child_id = child_of(parent, rows(parent, "child")[0].key)
    child = sv.get_workflow_result(child_id)
    assert child.status == "failed"
    assert isinstance(child.error, sv.ApplicationError)
    expected = {
        "application": ("ChildDeclined", "child declined", {"code": 7}),
        "plain": (f"{wf.ChildBroke.__module__}.ChildBroke", "child broke", None),
    }[mode]
    assert (child.error.type, child.error.message, child.error.details) == expected
    (child_row,) = rows(parent, "child")
    assert child_row.event_type == "ChildFailed"
    if catch:
        assert result.status == "completed", result.error
        assert result.output == {
            "class": "ApplicationError",
            "type": expected[0],
            "message": expected[1],
            "details": expected[2],
        }
    else:
        assert result.status == "failed"
        assert isinstance(result.error, sv.ApplicationError)
        assert (result.error.type, result.error.message, result.error.details) == expected


def test_is_ready_follows_the_delivered_view_not_the_childs_close(
    worker: Any, marker: Path
) -> None:
    parent = sv.start_workflow("child.ready", {"entry": "ready", "hold_while": str(marker)})
    wait_until(lambda: Ledger.objects.filter(entry="started:ready").exists())
    child_id = child_of(parent, rows(parent, "child")[0].key)
    assert sv.wait_workflow(child_id, timeout=20).status == "completed"
    (child_row,) = rows(parent, "child")
    assert child_row.event_type == "ChildCompleted"
    assert child_row.delivered_seq is None  # arrived, not delivered

    marker.unlink()
    result = sv.wait_workflow(parent, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == [False, True, "r"]
    child_row.refresh_from_db()
    (await_row,) = rows(parent, "await")
    assert child_row.delivered_seq == await_row.seq
    sv.replay_instance(parent)


# -- 4. cancelling children -------------------------------------------------------------


def test_cancel_records_one_command_per_handle_resolves_it_and_requests_the_childs_cancel(
    worker: Any,
) -> None:
    parent = sv.start_workflow("child.cancel_handle")
    wait_until(lambda: parked(parent) and len(rows(parent, "child_cancel")) == 2)
    waiting_row, done_row = rows(parent, "child")
    waiting_id, done_id = child_of(parent, waiting_row.key), child_of(parent, done_row.key)
    cancels = rows(parent, "child_cancel")
    assert [json.loads(r.reservation or "{}") for r in cancels] == [
        {"child_key": waiting_row.key, "child_id": waiting_id},
        {"child_key": done_row.key, "child_id": done_id},
    ]
    # The waiting handle resolved at its cancel command, without waiting for the child.
    assert waiting_row.event_type == "ChildCancelled"
    assert waiting_row.delivered_seq == cancels[0].seq
    assert done_row.event_type == "ChildCompleted"  # a stored result wins
    waiting = sv.describe(waiting_id)
    assert waiting.cancel_requested and parent in waiting.cancel_reason
    assert sv.wait_workflow(waiting_id, timeout=20).status == "cancelled"
    assert sv.describe(done_id).cancel_requested is False
    waiting_row.refresh_from_db()
    assert json.loads(waiting_row.data or "{}")["type"] == "Cancelled"  # not overwritten

    sv.signal(parent, "go")
    result = sv.wait_workflow(parent, timeout=20)
    assert result.status == "completed", result.error
    assert result.output == {"ready_after_cancel": True, "cancelled": "Cancelled", "done": "kept"}
    assert len(rows(parent, "child_cancel")) == 2  # replay repeated both calls without writes
    sv.replay_instance(parent)


def test_a_parent_cancelled_while_blocked_on_get_records_the_outcome_and_cancels_the_child(
    worker: Any,
) -> None:
    parent = sv.start_workflow("child.catch_get")
    child_id = child_of(parent, "#1:child:child.waiter")
    wait_until(lambda: parked(parent) and parked(child_id))
    epoch = instance(parent).lease_epoch

    sv.cancel_workflow(parent, "order withdrawn")
    # The parent observed its request at get(), caught it and parked again, still running.
    wait_until(lambda: parked(parent, after_epoch=epoch) and rows(parent, "receive") == [])
    wait_until(lambda: rows(parent, "child")[0].data is not None)
    (child_row,) = rows(parent, "child")
    assert child_row.event_type == "ChildCancelled"
    assert json.loads(child_row.data or "{}")["type"] == "WorkflowCancelled"
    assert instance(parent).status == "running"
    child = sv.describe(child_id)
    assert child.cancel_requested and parent in child.cancel_reason
    assert sv.wait_workflow(child_id, timeout=20).status == "cancelled"

    sv.signal(parent, "go")
    result = sv.wait_workflow(parent, timeout=20)
    assert (result.status, result.output) == ("completed", "order withdrawn")
    child_row.refresh_from_db()
    assert json.loads(child_row.data or "{}")["type"] == "WorkflowCancelled"


def test_cancelling_the_root_of_a_three_level_tree_cancels_every_level(worker: Any) -> None:
    root = sv.start_workflow("child.tree", 0)
    child = child_of(root, "#1:child:child.tree")
    grandchild = child_of(child, "#1:child:child.tree")
    wait_until(lambda: parked(root) and parked(child) and parked(grandchild))

    sv.cancel_workflow(root, "tear down")
    results = {iid: sv.wait_workflow(iid, timeout=20) for iid in (root, child, grandchild)}
    assert {iid: r.status for iid, r in results.items()} == dict.fromkeys(
        (root, child, grandchild), "cancelled"
    )
    root_error = results[root].error
    assert isinstance(root_error, sv.WorkflowCancelled) and root_error.reason == "tear down"
    for parent, sub in ((root, child), (child, grandchild)):
        described = sv.describe(sub)
        assert described.cancel_requested and parent in described.cancel_reason
        assert (described.parent_instance_id, described.parent_key) == (
            parent,
            "#1:child:child.tree",
        )
        (sub_row,) = rows(parent, "child")
        assert sub_row.event_type == "ChildCancelled"
        # Each level recorded its own cancellation at get(), carrying its own id.
        assert json.loads(sub_row.data or "{}")["fields"]["instance_id"] == parent
    assert [r.event_type for r in rows(grandchild)] == ["SignalCancelled", "WorkflowCancelled"]


def test_cancelling_a_middle_child_cancels_below_it_and_fails_its_unrequested_parent(
    worker: Any,
) -> None:
    root = sv.start_workflow("child.tree", 0)
    child = child_of(root, "#1:child:child.tree")
    grandchild = child_of(child, "#1:child:child.tree")
    wait_until(lambda: parked(root) and parked(child) and parked(grandchild))

    sv.cancel_workflow(child, "middle only")
    assert sv.wait_workflow(child, timeout=20).status == "cancelled"
    assert sv.wait_workflow(grandchild, timeout=20).status == "cancelled"
    # The root has no cancel request: the child's cancellation escapes it and fails it.
    result = sv.wait_workflow(root, timeout=20)
    assert result.status == "failed"
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert (result.error.instance_id, result.error.reason) == (child, "middle only")
    assert sv.describe(root).cancel_requested is False
    assert [r.event_type for r in rows(root, "child")] == ["ChildCancelled"]


@pytest.mark.parametrize("fail", [False, True])
def test_a_closing_parent_leaves_every_running_child_with_a_cancel_request(
    worker: Any, fail: bool
) -> None:
    parent = sv.start_workflow("child.leave_running", {"fail": fail})
    result = sv.wait_workflow(parent, timeout=20)
    assert result.status == ("failed" if fail else "completed")
    children = [child_of(parent, r.key) for r in rows(parent, "child")]
    assert len(children) == 2
    if not fail:
        assert result.output == children
    for child_id in children:
        described = sv.describe(child_id)
        assert described.cancel_requested and parent in described.cancel_reason
    for child_id in children:
        child = sv.wait_workflow(child_id, timeout=20)
        assert child.status == "cancelled"
        assert isinstance(child.error, sv.WorkflowCancelled) and child.error.instance_id == child_id
    closed = instance(parent)
    assert (closed.status, closed.runnable) == (result.status, False)  # not reopened


def test_client_calls_accept_child_ids(worker: Any) -> None:
    released = sv.start_workflow("child.of_client")
    cancelled = sv.start_workflow("child.of_client")
    released_child = child_of(released, "#1:child:child.waiter")
    cancelled_child = child_of(cancelled, "#1:child:child.waiter")
    wait_until(lambda: parked(released_child) and parked(cancelled_child))
    assert sv.get_workflow_result(released_child).status == "running"
    assert sv.describe(released_child).parent_instance_id == released

    sv.signal(released_child, "release", {"n": 1})
    sv.cancel_workflow(cancelled_child, "not needed")

    assert sv.wait_workflow(released, timeout=20).output == {"value": {"n": 1}}
    assert sv.get_workflow_result(released_child).output == {"n": 1}
    child = sv.wait_workflow(cancelled_child, timeout=20)
    assert child.status == "cancelled"
    assert sv.describe(cancelled_child).cancel_reason == "not needed"
    # The parent receives the child's own cancellation error, and may carry on.
    result = sv.wait_workflow(cancelled, timeout=20)
    assert (result.status, result.output) == (
        "completed",
        {"cancelled": [cancelled_child, "not needed"]},
    )
    assert sv.describe(cancelled).cancel_requested is False
    with pytest.raises(sv.WorkflowAlreadyCompleted):
        sv.signal(released_child, "release", 2)


# -- 4. what a child cancellation may reach -------------------------------------------------


@pytest.fixture
def stepper(tdb: None) -> Any:
    from selvedge_django.worker import Worker

    return Worker()


@sv.workflow(name="child.target.cancel_first")
def cancel_first(ctx: sv.WorkflowContext, _: Any) -> Any:
    """Start two waiting children, cancel the first, then wait for "done"."""
    first = ctx.start_child("child.waiter")
    ctx.start_child("child.waiter")
    first.cancel(ctx)
    return ctx.receive("done")


def cancel_second(ctx: sv.WorkflowContext, _: Any) -> Any:
    ctx.start_child("child.waiter")
    second = ctx.start_child("child.waiter")
    second.cancel(ctx)
    return ctx.receive("done")


def test_replay_checks_which_child_a_recorded_cancel_targets(
    stepper: Any, redefine: Callable[[str, Callable[..., Any]], None]
) -> None:
    from selvedge_django.testing import run_until_idle

    parent = sv.start_workflow(cancel_first, instance_id="target-parent")
    run_until_idle(stepper)
    first, second = rows(parent, "child")
    assert sv.describe(child_of(parent, first.key)).status == "cancelled"
    sv.replay_instance(parent)

    redefine("child.target.cancel_first", cancel_second)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_instance(parent)
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.NondeterminismError)
    assert divergence.key == rows(parent, "child_cancel")[0].key
    assert second.key in divergence.actual and first.key in divergence.expected

    sv.signal(parent, "done", 1)
    run_until_idle(stepper)
    result = sv.get_workflow_result(parent)
    assert result.status == "failed"
    assert isinstance(result.error, sv.NondeterminismError)
    # The second child is cancelled by the failed parent's close, not by a replayed cancel.
    assert sv.describe(child_of(parent, second.key)).cancel_reason == f"parent {parent} closed"


@sv.workflow(name="child.target.never_created")
def never_created(ctx: sv.WorkflowContext, child_id: str) -> Any:
    """Issue a child with ``child_id`` in a cancelled scope (never created), cancel it."""
    scoped, cancel = ctx.with_cancel()
    cancel()
    handle = scoped.start_child("child.waiter", child_id=child_id)
    handle.cancel(ctx)
    try:
        handle.get(ctx)
    except sv.Cancelled as error:
        outcome = type(error).__name__
    return [handle.id, outcome, ctx.receive("done")]


@pytest.mark.parametrize("whose", ["unrelated", "parent"])
def test_cancelling_a_child_that_was_never_created_cancels_nothing(
    stepper: Any, whose: str
) -> None:
    from selvedge_django.testing import run_until_idle

    sv.start_workflow("child.waiter", instance_id="bystander")
    parent = "never-created-parent"
    target = "bystander" if whose == "unrelated" else parent
    sv.start_workflow(never_created, target, instance_id=parent)
    run_until_idle(stepper)
    assert sv.describe("bystander").cancel_requested is False
    assert sv.describe(parent).cancel_requested is False
    assert sv.describe(parent).status == "running"
    (cancel_row,) = rows(parent, "child_cancel")
    assert json.loads(cancel_row.reservation or "{}")["child_id"] == target

    sv.signal(parent, "done", "yes")
    run_until_idle(stepper)
    result = sv.get_workflow_result(parent)
    assert result.status == "completed", result.error
    assert result.output == [target, "ScopeCancelled", "yes"]
    assert sv.describe("bystander").status == "running"
    sv.replay_instance(parent)


@sv.workflow(name="child.target.same_id_twice")
def same_id_twice(ctx: sv.WorkflowContext, _: Any) -> Any:
    """A real child, then a handle for the same id that a cancelled scope never created."""
    real = ctx.start_child("child.waiter", child_id="shared-child-id")
    scoped, cancel = ctx.with_cancel()
    cancel()
    ghost = scoped.start_child("child.waiter", child_id="shared-child-id")
    ghost.cancel(ctx)
    return [real.id, ctx.receive("done")]


def test_a_handle_that_never_created_its_child_spares_a_real_child_with_that_id(
    stepper: Any,
) -> None:
    from selvedge_django.testing import run_until_idle

    parent = sv.start_workflow(same_id_twice, instance_id="same-id-parent")
    run_until_idle(stepper)
    real = sv.describe("shared-child-id")
    assert real.parent_instance_id == parent and real.status == "running"
    assert real.cancel_requested is False


@sv.workflow(name="child.target.scope_and_close")
def scope_and_close(ctx: sv.WorkflowContext, child_id: str) -> Any:
    """A failed duplicate start and a never-created child in scopes that are then cancelled."""
    scoped, cancel = ctx.with_cancel()
    try:
        scoped.start_child("child.waiter", child_id=child_id)
    except sv.WorkflowAlreadyStarted:
        pass
    cancel()
    dead, kill = ctx.with_cancel()
    kill()
    dead.start_child("child.waiter", child_id=child_id)
    return "closed"


def test_scope_cancellation_and_the_close_spare_instances_the_parent_never_created(
    stepper: Any,
) -> None:
    from selvedge_django.testing import run_until_idle

    sv.start_workflow("child.waiter", instance_id="bystander-2")
    parent = sv.start_workflow(scope_and_close, "bystander-2", instance_id="scope-close-parent")
    run_until_idle(stepper)
    assert sv.get_workflow_result(parent).status == "completed"
    assert sv.describe("bystander-2").cancel_requested is False
    assert sv.describe("bystander-2").status == "running"
