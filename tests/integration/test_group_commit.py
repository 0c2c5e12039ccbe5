"""Group commit (worker.group_commit): writes submitted together commit in one transaction.

Real threads and the real store; the test holds the batch writer's turn while the
writes queue (the moment several attempts finish together), then lets it go.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

import selvedge_django as sv
from selvedge_django.models import HistoryEvent, WorkflowInstance
from selvedge_django.operations.base import client_store
from selvedge_django.storage import RowBusy
from selvedge_django.worker import Worker
from selvedge_django.worker.group_commit import GroupCommit
from tests.conftest import wait_until

pytestmark = pytest.mark.usefixtures("tdb")


def submit_together(
    group: GroupCommit,
    writes: list[Callable[[], Any]],
    batched: list[Callable[[], Any]] | None = None,
) -> tuple[list[Any], list[BaseException | None], list[int]]:
    """Submit each write (with its ``batched`` form, if given) from a thread of its own
    while the writer's turn is held; return each thread's result, error and ident."""
    results: list[Any] = [None] * len(writes)
    errors: list[BaseException | None] = [None] * len(writes)
    idents = [0] * len(writes)

    def run(index: int) -> None:
        idents[index] = threading.get_ident()
        try:
            results[index] = group.submit(
                writes[index], None if batched is None else batched[index]
            )
        except BaseException as error:
            errors[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writes))]
    with group._writing:
        for thread in threads:
            thread.start()
        wait_until(lambda: len(group._waiting) == len(writes))
    for thread in threads:
        thread.join(30)
    return results, errors, idents


@contextlib.contextmanager
def transaction_count(commits: list[int]) -> Iterator[None]:
    """Note each COMMIT the database runs meanwhile, on any connection of this process
    (each statement run outside a transaction counts as one too)."""
    from django.db.backends.signals import connection_created

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if context["connection"].autocommit and not sql.lstrip().upper().startswith("BEGIN"):
            commits.append(1)
        return execute(sql, params, many, context)

    def counted_commit(conn: Any) -> None:
        original = conn.commit

        def commit() -> None:
            commits.append(1)
            original()

        conn.commit = commit
        conn.execute_wrappers.append(wrapper)

    def on_created(sender: Any, connection: Any, **kwargs: Any) -> None:
        counted_commit(connection)

    connection_created.connect(on_created, dispatch_uid="test-group-commit-count")
    try:
        yield
    finally:
        connection_created.disconnect(dispatch_uid="test-group-commit-count")


def test_writes_that_wait_together_commit_in_one_transaction() -> None:
    group = GroupCommit(client_store())
    seen: list[tuple[int, bool]] = []

    def write(value: int) -> Callable[[], int]:
        def run() -> int:
            seen.append((threading.get_ident(), connection.in_atomic_block))
            return value * 10

        return run

    results, errors, _ = submit_together(group, [write(1), write(2), write(3)])
    assert results == [10, 20, 30]
    assert errors == [None, None, None]
    # One thread wrote all three, inside one transaction.
    assert len({ident for ident, _ in seen}) == 1
    assert all(in_transaction for _, in_transaction in seen)


def test_a_failed_batch_is_written_again_one_by_one_by_each_submitter() -> None:
    group = GroupCommit(client_store())
    runs: list[tuple[str, int]] = []

    def write(name: str, fails: bool) -> Callable[[], str]:
        def run() -> str:
            runs.append((name, threading.get_ident()))
            if fails:
                raise DatabaseError(f"{name} refused")
            return name

        return run

    results, errors, idents = submit_together(
        group, [write("a", False), write("b", True), write("c", False)]
    )
    assert results[0] == "a" and results[2] == "c"
    assert isinstance(errors[1], DatabaseError) and "b refused" in str(errors[1])
    assert errors[0] is None and errors[2] is None
    # After the batch rolled back, each outcome was written again by its own thread.
    alone = {name: ident for name, ident in runs[-3:]}
    assert alone == {"a": idents[0], "b": idents[1], "c": idents[2]}


def test_a_write_alone_runs_in_its_own_transaction() -> None:
    group = GroupCommit(client_store())
    assert group.submit(lambda: connection.in_atomic_block) is False


def test_a_write_whose_row_is_busy_is_written_alone_after_the_batch() -> None:
    group = GroupCommit(client_store())
    runs: list[tuple[str, str, int]] = []

    def writes(name: str, busy: bool) -> tuple[Callable[[], str], Callable[[], str]]:
        def alone() -> str:
            runs.append((name, "alone", threading.get_ident()))
            return name

        def batched() -> str:
            runs.append((name, "batched", threading.get_ident()))
            if busy:
                raise RowBusy(name)
            return name

        return alone, batched

    pairs = [writes("a", False), writes("b", True), writes("c", False)]
    results, errors, idents = submit_together(
        group, [alone for alone, _ in pairs], [batched for _, batched in pairs]
    )
    assert results == ["a", "b", "c"] and errors == [None, None, None]
    batch = [(name, ident) for name, how, ident in runs if how == "batched"]
    assert [name for name, _ in batch] == ["a", "b", "c"]
    assert len({ident for _, ident in batch}) == 1  # one thread wrote the batch
    # The busy one wrote nothing in the batch and was written alone by its own thread.
    assert [(name, ident) for name, how, ident in runs if how == "alone"] == [("b", idents[1])]


def background_claims(count: int) -> list[Any]:
    """Claimed tasks of ``count`` instances whose workflow waits for them (an activity
    another worker runs)."""
    ids = [
        sv.start_workflow("act.run", {"activity": "act.step", "input": {"tag": f"gc{i}"}})
        for i in range(count)
    ]
    worker = Worker(activity_queues=[])
    worker.resumptions.inline = True
    assert worker.dispatcher.run_once() == count
    claims = client_store().tasks.claim_tasks("activity-worker", count, ["act.step"])
    assert sorted(c.claim.instance_id for c in claims) == sorted(ids)
    return [c.claim for c in claims]


def completion(claim: Any, output: str) -> tuple[Callable[[], bool], Callable[[], bool]]:
    """What an attempt's success submits: the write alone, and as one of a batch."""
    store = client_store()
    return (
        lambda: store.tasks.complete_task(claim, output),
        lambda: store.tasks.complete_task(claim, output, if_free=True),
    )


def test_background_completions_that_finish_together_commit_together() -> None:
    claims = background_claims(3)
    # The worker's own group commit, on every database.
    group = Worker().runtime.attempts.outcomes._group
    assert isinstance(group, GroupCommit)
    commits: list[int] = []
    pairs = [completion(claim, json.dumps(f"out{i}")) for i, claim in enumerate(claims)]
    with transaction_count(commits):
        results, errors, _ = submit_together(
            group, [alone for alone, _ in pairs], [batched for _, batched in pairs]
        )
    assert results == [True, True, True] and errors == [None, None, None]
    assert len(commits) == 1
    for i, claim in enumerate(claims):
        row = HistoryEvent.objects.get(instance_id=claim.instance_id, key=claim.key)
        assert row.data == json.dumps(f"out{i}")
        assert WorkflowInstance.objects.get(instance_id=claim.instance_id).runnable


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite has no row locks: one writer at a time"
)
def test_a_completion_whose_instance_row_a_caller_holds_waits_alone() -> None:
    held, free = background_claims(2)
    group = GroupCommit(client_store())
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            WorkflowInstance.objects.select_for_update().get(instance_id=held.instance_id)
            locked.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    locked.wait(10)
    done: dict[str, bool] = {}
    threads = []
    try:
        for name, claim in (("held", held), ("free", free)):
            alone, batched = completion(claim, json.dumps(name))

            def run(name: str = name, alone: Any = alone, batched: Any = batched) -> None:
                done[name] = group.submit(alone, batched)
                connection.close()

            threads.append(threading.Thread(target=run))
            threads[-1].start()
        # The free one is recorded while the caller still holds the other's row.
        wait_until(lambda: "free" in done)
        assert done == {"free": True}
    finally:
        release.set()
        holder.join(30)
        for thread in threads:
            thread.join(30)
    assert done == {"free": True, "held": True}
    row = HistoryEvent.objects.get(instance_id=held.instance_id, key=held.key)
    assert row.data == json.dumps("held")
