"""The crash matrix of the operators' operations: resume, fork and terminate.

A real ``runselvedge`` client process runs each operation and exits (``os._exit``)
either just before the last statement of its transaction (the database rolls the
rest back) or right after it commits. Whichever it was, the instance is exactly
as it was before, or exactly as one operation leaves it: never half-written. The
operator's retry is told what happened (refused as a second resume, fork or
terminate when the first committed; done when it had not), and the run then
completes, replays, and holds each archived row once per generation.
A leader process exiting inside the execution timeout sweep, or right after it
commits, leaves the run to the next leader, which terminates it once.
(tests/integration/test_execution_timeout.py fails every statement of the
sweep in turn; tests/integration/test_resume.py and test_terminate.py
do the same for the client calls, and an ambiguous commit of each.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    WorkflowInstance,
)
from selvedge_django.testing import FAULT_EXIT_STATUS, FaultInjector, run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import ROOT
from tests.testapp.workflows import recovery as flows

pytestmark = pytest.mark.slow

QUIET = {"run_local_starts": False}


@pytest.fixture(autouse=True)
def broken() -> Iterator[None]:
    flows.BROKEN.clear()
    yield
    flows.BROKEN.clear()


def drive(instance_id: str, timeout: float = 30.0) -> str:
    """Run an inline worker until the instance is no longer running."""
    deadline = time.monotonic() + timeout
    worker = Worker(**QUIET)
    while True:
        run_until_idle(worker)
        status = WorkflowInstance.objects.get(instance_id=instance_id).status
        if status != "running":
            return status
        assert time.monotonic() < deadline, f"{instance_id} still running"


def failed_order(name: str) -> str:
    """A resume.order run that its charge's failure closed."""
    flows.BROKEN.add("charge")
    iid = sv.start_workflow("resume.order", name, instance_id=name)
    sv.signal(iid, "go", {"by": "ops"})
    assert drive(iid) == "failed"
    flows.BROKEN.discard("charge")
    return iid


def parked_order(name: str) -> str:
    """A resume.order run parked at its receive of "go"."""
    iid = sv.start_workflow("resume.order", name, instance_id=name)
    run_until_idle(Worker(**QUIET))
    assert WorkflowInstance.objects.get(instance_id=iid).status == "running"
    return iid


def state(*instance_ids: str) -> dict[str, Any]:
    """Every row an operation may write, per instance."""
    found: dict[str, Any] = {}
    for iid in instance_ids:
        rows = WorkflowInstance.objects.filter(instance_id=iid).values()
        inst = [{k: v for k, v in row.items() if k != "updated_at"} for row in rows]
        found[iid] = {
            "instance": inst,
            "history": list(HistoryEvent.objects.filter(instance_id=iid).order_by("id").values()),
            "archive": list(ArchivedHistoryEvent.objects.filter(instance_id=iid).values()),
            "tasks": list(ActivityTask.objects.filter(instance_id=iid).values()),
            "signals": list(SignalMessage.objects.filter(instance_id=iid).values()),
        }
    return found


def runselvedge(
    args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py runselvedge ARGS`` in a new process on the test database."""
    import os

    full_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    if connection.vendor == "postgresql":
        full_env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    return subprocess.run(
        [sys.executable, "-m", "django", "runselvedge", *args],
        cwd=str(ROOT),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def last_step(operation: str, run: Callable[[], object]) -> int:
    """The step number of the last statement ``run`` issues in ``operation``'s transaction.

    A close's wake-up for waiters is sent after the commit, in a statement of its own
    (storage.wakeups.is_waiter_hint): not a step inside the transaction."""
    injector = FaultInjector(trace=True).install()
    try:
        run()
        return max(
            s.step for s in injector.statements if s.operation == operation and not s.waiter_hint
        )
    finally:
        injector.uninstall()


# Each case: prepare(name) -> (the source id, the CLI arguments, the same call on a twin).
def resume_case(name: str) -> tuple[str, list[str], Callable[[], object]]:
    twin = failed_order(f"{name}-twin")
    return failed_order(name), ["resume", name], lambda: sv.resume_workflow(twin)


def fork_case(name: str) -> tuple[str, list[str], Callable[[], object]]:
    twin = failed_order(f"{name}-twin")
    run = lambda: sv.fork_workflow(twin, new_instance_id=f"{twin}-copy")  # noqa: E731
    return failed_order(name), ["fork", name, "--id", f"{name}-copy"], run


def terminate_case(name: str) -> tuple[str, list[str], Callable[[], object]]:
    twin = parked_order(f"{name}-twin")
    run = lambda: sv.terminate_workflow(twin, "twin")  # noqa: E731
    return parked_order(name), ["terminate", name, "--reason", "stuck"], run


CASES: dict[str, tuple[str, Callable[[str], tuple[str, list[str], Callable[[], object]]]]] = {
    "resume": ("resume", resume_case),
    "fork": ("fork", fork_case),
    "terminate": ("terminate", terminate_case),
}


def finish(iid: str) -> None:
    """Bring a resumed, forked or terminated resume.order run to its completion."""
    if WorkflowInstance.objects.get(instance_id=iid).status == "failed":
        sv.resume_workflow(iid)
    run_until_idle(Worker(**QUIET))
    if not SignalMessage.objects.filter(instance_id=iid, channel="go").exists():
        sv.signal(iid, "go", {"by": "ops"})  # a run terminated at its receive waits for it
    assert drive(iid) == "completed"
    result = sv.get_workflow_result(iid)
    assert result.output["charged"] == f"charged {iid.split('-copy')[0]}"
    sv.replay_instance(iid)
    # Once per generation: no key appears twice among one generation's archived rows.
    archived = list(
        ArchivedHistoryEvent.objects.filter(instance_id=iid).values_list("generation", "key")
    )
    assert len(archived) == len(set(archived)), archived
    keys = list(HistoryEvent.objects.filter(instance_id=iid).values_list("key", flat=True))
    assert len(keys) == len(set(keys)), keys


@pytest.mark.parametrize("when", ["inside", "after_commit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_client_exiting_during_an_operators_operation_leaves_it_whole_or_undone(
    tdb: None, name: str, when: str
) -> None:
    operation, prepare = CASES[name]
    iid = f"crash-{name}-{when}".replace("_", "-")
    source, args, twin_run = prepare(iid)
    step = last_step(operation, twin_run)
    touched = [source, f"{source}-copy"]
    before = state(*touched)

    injector = FaultInjector()
    if when == "inside":
        injector.exit_at_statement(None, operation=operation, step=step)
    else:
        injector.exit_after_commit(None, operation=operation, step=step)
    done = runselvedge(args, injector.to_env())
    assert done.returncode == FAULT_EXIT_STATUS, done.stdout + done.stderr

    if when == "inside":
        # Rolled back: nothing changed, and the operator's retry does the work.
        assert state(*touched) == before
        retry = runselvedge(args)
        assert retry.returncode == 0, retry.stdout + retry.stderr
    else:
        # Committed: the retry is refused and writes nothing more.
        after = state(*touched)
        assert after != before
        retry = runselvedge(args)
        assert retry.returncode != 0, retry.stdout
        assert state(*touched) == after
    target = f"{source}-copy" if name == "fork" else source
    finish(target)
    if name == "fork":
        # The source is untouched by its fork, crashed or not.
        assert state(source)[source] == before[source]


# -- the leader's execution timeout sweep ------------------------------------------------

LEADER_OVERRIDES = {
    "LEASE": {"TTL": 1.0, "RENEW_INTERVAL": 0.25, "MARGIN": 0.25, "MAX_SKEW": 0.1},
    "LEADER_LEASE_DURATION": 2,
    "LEADER_HEARTBEAT_INTERVAL": 0.5,
}


@pytest.mark.parametrize("when", ["inside", "after_commit"])
def test_a_leader_exiting_during_the_timeout_sweep_terminates_the_run_once(
    tdb: None, when: str, worker_process: Callable[..., Any]
) -> None:
    iid = sv.start_workflow("resume.order", "swept", instance_id="swept", execution_timeout=1)
    run_until_idle(Worker(**QUIET))
    before = state(iid)
    injector = FaultInjector()
    # The close row: the sweep's last write for this run, inside its transaction.
    close = r"INSERT INTO .*historyevent"
    if when == "inside":
        injector.exit_at_statement(close, operation="sweep_execution_timeouts")
    else:
        injector.exit_after_commit(close, operation="sweep_execution_timeouts")
    env = {**injector.to_env(), "SELVEDGE_TEST_OVERRIDES": json.dumps(LEADER_OVERRIDES)}
    proc = worker_process(env=env, wait_started=False)
    status = proc.proc.wait(60)
    assert status == FAULT_EXIT_STATUS, proc.output()
    closes = HistoryEvent.objects.filter(instance_id=iid, key="$close")
    if when == "inside":
        assert state(iid) == before  # rolled back with the process
    else:
        assert closes.count() == 1
    # The next leader finishes the sweep, or finds nothing left to do.
    deadline = time.monotonic() + 30
    while WorkflowInstance.objects.get(instance_id=iid).status == "running":
        Worker(**QUIET).store.execution_timeouts.sweep_execution_timeouts(10)
        assert time.monotonic() < deadline
    assert closes.count() == 1
    error = sv.get_workflow_result(iid).error
    assert isinstance(error, sv.WorkflowTerminated) and error.reason == "execution timeout"
    sv.replay_instance(iid)
