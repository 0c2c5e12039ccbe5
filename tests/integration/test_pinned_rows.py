"""Nobody else's lock stops your renewals (INVARIANTS 9).

A client's transaction that signals or cancels an instance holds that instance's
row until it commits. The worker's renewer, its timer poller and its leader's
sweeps must go on around it: on PostgreSQL they skip a row another transaction
holds and try it again at the next round, so every other lease and claim is
renewed on time and every activity body runs once. On SQLite a write
transaction holds the whole database, so every writer waits for it: the test
there keeps the transaction within the documented bound (shorter than
``LEASE["TTL"] - LEASE["RENEW_INTERVAL"]``), and the worker loses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.models import ActivityTask, TimerSubscription, WorkflowInstance
from selvedge_django.storage import store_for
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import Ledger

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL only: a SQLite write transaction holds the whole database by design",
)


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def hold(tag: str, marker: Path, *, background: bool = False) -> str:
    """Start act.run with an act.wait that holds (ignoring cancellation) while ``marker`` exists."""
    data: dict[str, Any] = {
        "activity": "act.wait",
        "input": {"tag": tag, "hold_while": str(marker), "mode": "ignore", "max_hold": 60},
    }
    if background:
        data["background"] = True
    return sv.start_workflow("act.run", data)


def entries(tag: str) -> list[str]:
    return sorted(
        Ledger.objects.filter(entry__startswith=f"wait:{tag}:").values_list("entry", flat=True)
    )


class RowHolder:
    """A client thread that holds an instance's row in an open transaction.

    ``how`` is ``signal`` or ``cancel`` (the client API calls that lock the row),
    held until :meth:`release`.
    """

    def __init__(self, instance_id: str, how: str) -> None:
        self.instance_id = instance_id
        self.how = how
        self.holding = threading.Event()
        self._release = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="row-holder", daemon=True)

    def __enter__(self) -> RowHolder:
        self._thread.start()
        wait_until(lambda: self.holding.is_set() or self.error is not None)
        if self.error is not None:
            raise self.error
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    def _run(self) -> None:
        try:
            with transaction.atomic():
                if self.how == "signal":
                    sv.signal(self.instance_id, "poke", "held")
                else:
                    sv.cancel_workflow(self.instance_id, "held")
                self.holding.set()
                self._release.wait(60)
        except BaseException as error:
            self.error = error
        finally:
            close_old_connections()
            connection.close()


# -- the renewer ---------------------------------------------------------------------------


def test_a_long_client_transaction_leaves_other_leases_and_claims_renewed(
    make_worker: Callable[..., Any], marker: Path
) -> None:
    """A signal held open pins only its own instance; every activity body runs once.

    The worker holds three attempts (two inline, with their leases; one in the
    background, a claim only) with a 4 s lease and claim TTL. A client signals the
    first instance and keeps its transaction open: 9 s on PostgreSQL (more than two
    TTLs), 2 s on SQLite (the documented bound: shorter than TTL - RENEW_INTERVAL).
    """
    postgres = connection.vendor == "postgresql"
    held_for = 9.0 if postgres else 2.0
    make_worker(max_concurrent_activities=4, max_concurrent_resumptions=4)
    pinned = hold("pinned", marker)
    inline = hold("inline", marker)
    background = hold("bg", marker, background=True)
    for tag in ("pinned", "inline", "bg"):
        wait_until(lambda tag=tag: entries(tag) == [f"wait:{tag}:1:start"])

    with RowHolder(pinned, "signal"):
        time.sleep(held_for)  # the client's transaction is the workload here, not a wait
    marker.unlink()

    results = {i: sv.wait_workflow(i, timeout=30) for i in (pinned, inline, background)}
    assert {r.status for r in results.values()} == {"completed"}, results
    for tag in ("pinned", "inline", "bg"):
        assert entries(tag) == [f"wait:{tag}:1:end", f"wait:{tag}:1:start"]
    tasks = ActivityTask.objects.filter(instance_id__in=list(results))
    assert set(tasks.values_list("status", "attempts", "failures")) == {("completed", 1, 0)}
    # The unpinned instance kept its lease all along: one execution ran it.
    assert WorkflowInstance.objects.get(instance_id=inline).lease_epoch == 1


# -- the timer poller and the leader's sweeps (PostgreSQL row locks) ------------------------


def finished_within(work: Callable[[], Any], timeout: float) -> Any:
    """Run ``work`` in a thread; fail (instead of hanging the suite) if it does not return."""
    out: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as error:
            failure.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"blocked behind a row another transaction holds ({timeout} s)"
    if failure:
        raise failure[0]
    return out[0]


@postgres_only
def test_the_timer_poller_fires_around_an_instance_a_client_holds(tdb: None) -> None:
    store = store_for("default", Codec())
    ids = [sv.start_workflow("cancel.wait", {"kind": "sleep"}) for _ in range(2)]
    run_until_idle(Worker())  # both sleep for an hour
    TimerSubscription.objects.filter(instance_id__in=ids).update(fire_at_ms=0)
    pinned, free = ids
    with RowHolder(pinned, "signal"):
        assert finished_within(lambda: store.waits.fire_due_timers(10), timeout=10) == 1
        assert not TimerSubscription.objects.filter(instance_id=free).exists()
        assert TimerSubscription.objects.filter(instance_id=pinned, fired=False).exists()
    assert store.waits.fire_due_timers(10) == 1  # its turn comes at the next round


@postgres_only
@pytest.mark.parametrize("due", ["lapsed", "schedule_to_start"])
def test_the_leaders_sweep_goes_around_an_instance_a_client_holds(tdb: None, due: str) -> None:
    """An exhausted lapse or a schedule-to-start timeout of a held instance waits a round."""
    store = store_for("default", Codec())
    options: dict[str, Any] = {"queue": "sweep-q", "retry_policy": {"max_attempts": 1}}
    if due == "schedule_to_start":
        options["schedule_to_start_timeout"] = 60
    ids = [
        sv.start_workflow(
            "act.run", {"activity": "act.step", "input": {"tag": f"s{n}"}, "options": options}
        )
        for n in range(2)
    ]
    run_until_idle(Worker(activity_queues=[]))  # both wait for their task
    tasks = ActivityTask.objects.filter(instance_id__in=ids)
    if due == "lapsed":
        assert len(store.tasks.claim_tasks("gone", 2, ["act.step"])) == 2
        tasks.update(claim_expires_ms=0)  # a vanished worker's claims, out of retries
    else:
        tasks.update(schedule_deadline_ms=0)
    pinned, free = ids
    with RowHolder(pinned, "cancel"):
        assert (
            finished_within(lambda: store.task_timeouts.sweep_activity_timeouts(10), timeout=10)
            == 1
        )
        assert ActivityTask.objects.get(instance_id=free).status == "failed"
        assert ActivityTask.objects.get(instance_id=pinned).status != "failed"
    assert store.task_timeouts.sweep_activity_timeouts(10) == 1
    assert ActivityTask.objects.get(instance_id=pinned).status == "failed"


@postgres_only
@pytest.mark.parametrize("held", ["instance", "parent"])
def test_the_execution_timeout_sweep_goes_around_a_run_a_client_holds(
    tdb: None, held: str, selvedge_clock: Any
) -> None:
    """An overdue run whose row (or its parent's) a client holds waits a round; the
    other overdue runs of the batch are terminated on time."""
    store = store_for("default", Codec())
    parent = sv.start_workflow("terminate.timed_parent", 5)
    free = sv.start_workflow("wait.sleep", {"seconds": 3600}, execution_timeout=5)
    run_until_idle(Worker(activity_queues=[], run_local_starts=False))
    selvedge_clock.advance(6)
    (child,) = WorkflowInstance.objects.filter(parent_instance_id=parent)
    pinned = child.instance_id
    with RowHolder(pinned if held == "instance" else parent, "signal"):
        closed = finished_within(
            lambda: store.execution_timeouts.sweep_execution_timeouts(10), timeout=10
        )
        assert [run.instance_id for run in closed] == [free]
        assert WorkflowInstance.objects.get(instance_id=pinned).status == "running"
    assert [run.instance_id for run in store.execution_timeouts.sweep_execution_timeouts(10)] == [
        pinned
    ]
    assert WorkflowInstance.objects.get(instance_id=pinned).status == "failed"
