"""Group commit (worker.group_commit): writes submitted together commit in one transaction.

Real threads and the real store; the test holds the batch writer's turn while the
writes queue (the moment several attempts finish together), then lets it go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection

from selvedge_django.operations.base import client_store
from selvedge_django.worker.group_commit import GroupCommit
from tests.conftest import wait_until

pytestmark = pytest.mark.usefixtures("tdb")


def submit_together(
    group: GroupCommit, writes: list[Callable[[], Any]]
) -> tuple[list[Any], list[BaseException | None], list[int]]:
    """Submit each write from a thread of its own while the writer's turn is held;
    return each thread's result, error and ident."""
    results: list[Any] = [None] * len(writes)
    errors: list[BaseException | None] = [None] * len(writes)
    idents = [0] * len(writes)

    def run(index: int) -> None:
        idents[index] = threading.get_ident()
        try:
            results[index] = group.submit(writes[index])
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
