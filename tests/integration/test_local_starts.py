"""Starts handed to a worker of the starting process (``RUN_LOCAL_STARTS``).

A start made where an in-process Worker runs is inserted already leased to that
worker and runs without a dispatch. These tests check what a user relies on:
the workflow runs once and completes, a rolled-back start leaves nothing behind
(not even a busy slot), a worker without a free slot gives the instance back to
the dispatchers, and stopped workers, unregistered workflows and the setting
turned off all fall back to the normal runnable start. A starting process that dies
at its commit is tests/processes/test_local_start_processes.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from django.db import transaction

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance
from selvedge_django.testing import FaultInjector
from tests.conftest import wait_until
from tests.testapp.models import Ledger


def leased_rows() -> dict[str, tuple[str, int, bool]]:
    return {
        i: (owner, epoch, runnable)
        for i, owner, epoch, runnable in WorkflowInstance.objects.values_list(
            "instance_id", "lease_owner", "lease_epoch", "runnable"
        )
    }


def test_a_start_runs_on_the_local_worker_without_a_dispatch(
    make_worker: Callable[..., Any],
) -> None:
    worker = make_worker()
    injector = FaultInjector(trace=True).install()
    try:
        instance_id = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
        result = sv.wait_workflow(instance_id, timeout=20)
    finally:
        injector.uninstall()
    assert result.status == "completed" and result.output == 6
    row = WorkflowInstance.objects.get(instance_id=instance_id)
    # Leased once, by the start itself: epoch 1, and no dispatcher ever leased it.
    assert row.lease_epoch == 1 and row.lease_owner == ""
    dispatches = [
        s
        for s in injector.statements
        if s.operation in ("lease_batch", "acquire_batch", "load_snapshot")
        and instance_id in s.params
    ]
    assert dispatches == []
    starts = [
        s
        for s in injector.statements
        if s.operation == "create_instance" and s.sql.startswith("INSERT")
    ]
    assert len(starts) == 1 and worker.worker_id in starts[0].params


def test_a_rolled_back_start_writes_nothing_and_keeps_every_slot(
    make_worker: Callable[..., Any],
) -> None:
    worker = make_worker(max_concurrent_resumptions=2)
    with pytest.raises(RuntimeError, match="view failed"), transaction.atomic():
        instance_id = sv.start_workflow("test.sum3", {"a": 1, "b": 1, "c": 1})
        raise RuntimeError("view failed")
    assert not WorkflowInstance.objects.filter(instance_id=instance_id).exists()
    assert worker.resumptions.free_slots() == 2
    # The worker still takes starts, all of them.
    ids = [sv.start_workflow("test.sum3", {"a": i, "b": 0, "c": 0}) for i in range(4)]
    assert [sv.wait_workflow(i, timeout=20).output for i in ids] == [0, 1, 2, 3]
    wait_until(lambda: worker.resumptions.free_slots() == 2)


def test_a_start_inside_atomic_runs_only_after_commit(make_worker: Callable[..., Any]) -> None:
    make_worker()
    with transaction.atomic():
        instance_id = sv.start_workflow("test.ledger", ["local:in-atomic"])
        # Not committed: the worker cannot have run it (it could not even see it).
        assert not Ledger.objects.filter(entry="local:in-atomic").exists()
    assert sv.wait_workflow(instance_id, timeout=20).output == ["local:in-atomic"]


def test_a_start_committed_past_its_lease_belief_goes_to_the_dispatchers(
    make_worker: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The lease of a start handed to this process's worker runs from its insert. When
    the project keeps its transaction open past the lease's belief, the worker can no
    longer trust that lease at the commit: it gives the instance to the dispatchers
    instead of running an execution that would be abandoned at its first write."""
    lease = {"TTL": 3, "RENEW_INTERVAL": 1, "MARGIN": 1, "MAX_SKEW": 0.5}  # belief 1.5 s
    make_worker(lease=lease)
    with caplog.at_level(logging.WARNING, logger="selvedge_django"):
        with transaction.atomic():
            instance_id = sv.start_workflow("test.sum3", {"a": 2, "b": 3, "c": 4})
            time.sleep(2.0)  # the project's long transaction, past the belief
        result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed" and result.output == 9
    assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage().lower()] == []
    assert WorkflowInstance.objects.get(instance_id=instance_id).lease_epoch == 2  # one dispatch


@contextmanager
def all_threads_busy(worker: Any) -> Iterator[None]:
    """Keep every execution thread of ``worker`` busy until the block ends."""
    release = threading.Event()
    busy = threading.Semaphore(0)

    def occupy() -> None:
        busy.release()
        release.wait(20)

    try:
        for _ in range(worker.resumptions.size):
            worker.resumptions.submit(occupy)
        for _ in range(worker.resumptions.size):
            assert busy.acquire(timeout=10)
        assert worker.resumptions.free_slots() == 0
        yield
    finally:
        release.set()


def test_a_worker_without_a_free_slot_at_commit_hands_the_start_to_the_dispatchers(
    make_worker: Callable[..., Any],
) -> None:
    worker = make_worker(max_concurrent_resumptions=1)
    with ExitStack() as busy:
        with transaction.atomic():
            # The worker has its one slot free now: the start is leased to it ...
            late = sv.start_workflow("test.sum3", {"a": 5, "b": 5, "c": 5})
            # ... but before the commit its only execution thread becomes busy.
            busy.enter_context(all_threads_busy(worker))
        # At commit the worker had no slot: the lease was released and the instance
        # left runnable for any dispatcher (here the same worker's, once it is free).
        # A dispatcher poll that counted the slot free just before the busy task took
        # it may already have leased it again (epoch 2), to run from the backlog.
        assert leased_rows()[late] in {("", 1, True), (worker.worker_id, 2, False)}
    result = sv.wait_workflow(late, timeout=20)
    assert result.status == "completed" and result.output == 15
    assert WorkflowInstance.objects.get(instance_id=late).lease_epoch == 2  # one dispatch


def test_a_full_worker_is_not_offered_the_start(make_worker: Callable[..., Any]) -> None:
    worker = make_worker(max_concurrent_resumptions=1)
    with all_threads_busy(worker):
        injector = FaultInjector(trace=True).install()
        try:
            queued = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 0})
        finally:
            injector.uninstall()
        # An ordinary runnable start: the insert leases it to nobody.
        [insert] = [
            s
            for s in injector.statements
            if s.operation == "create_instance" and "INSERT INTO" in s.sql
        ]
        assert worker.worker_id not in insert.params
        # A dispatcher poll that counted the slot free just before it was taken may have
        # leased it since (epoch 1), to run from the backlog.
        assert leased_rows()[queued] in {("", 0, True), (worker.worker_id, 1, False)}
    assert sv.wait_workflow(queued, timeout=20).output == 3


@pytest.mark.parametrize("case", ["stopped", "setting off", "not registered here"])
def test_starts_fall_back_to_dispatch(
    make_worker: Callable[..., Any], scratch_name: str, case: str
) -> None:
    name = "test.sum3"
    if case == "stopped":
        make_worker().stop(timeout=10)
    elif case == "setting off":
        make_worker(run_local_starts=False, max_concurrent_resumptions=1)
    else:
        make_worker()
        name = scratch_name  # started by name; no definition in this process
    with transaction.atomic():
        instance_id = sv.start_workflow(name, {"a": 1, "b": 1, "c": 1})
        # Read before the commit, so that no dispatcher can have leased it yet: the
        # row is as the start wrote it (a local start leases it in its INSERT).
        # Keeping the worker's threads busy instead raced with a dispatch round
        # already under way on a loaded machine.
        assert leased_rows()[instance_id] == ("", 0, True)
    if case == "setting off":
        assert sv.wait_workflow(instance_id, timeout=20).output == 3


@pytest.fixture
def scratch_name() -> str:
    return "local.not_registered_anywhere"


def test_the_setting_is_validated(settings: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from selvedge_django.conf import get_settings

    settings.SELVEDGE = {"RUN_LOCAL_STARTS": "yes"}
    with pytest.raises(ImproperlyConfigured, match="RUN_LOCAL_STARTS"):
        get_settings()


# -- faults -----------------------------------------------------------------------------


def test_a_failed_insert_of_a_handed_over_start_writes_nothing(
    make_worker: Callable[..., Any],
) -> None:
    from selvedge_django.testing import Fault, InjectedFault

    worker = make_worker(max_concurrent_resumptions=2)
    injector = FaultInjector()
    injector.add(Fault("fail", operation="create_instance", pattern=r"^INSERT"))
    injector.install()
    try:
        with pytest.raises(InjectedFault):
            sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="local-fail")
    finally:
        injector.uninstall()
    assert not WorkflowInstance.objects.filter(instance_id="local-fail").exists()
    assert worker.resumptions.free_slots() == 2
    # The caller may simply start it again.
    sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}, instance_id="local-fail")
    assert sv.wait_workflow("local-fail", timeout=20).output == 6
