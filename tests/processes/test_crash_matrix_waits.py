"""The crash matrix, second part: the steps fault.flow leaves out, and prune beside workers.

``fault.flow2`` (tests/testapp/workflows/faults.py) runs a transactional activity, a
``wait_condition`` delivery, a background step whose reservation releases the
lease (the workflow's worker serves no queue for it: a workflow-only worker), a
schedule-to-start timeout that only the leader's sweep records, and a
cancellation requested from inside the run, whose close cancels a running
child. The method is tests/processes/test_crash_matrix.py's: a traced run (the
*baseline*) gives each store operation's statements; then every statement of a
target call fails in turn in process, and a real worker process exits right
after the call commits (and, for some, inside its transaction). Two in-process
workers share the work: the workflow-only one (default queue) and an
activity-only one serving FAULT_BG_QUEUE (neither its dispatcher nor its leader
runs). In the process runs the activity-only worker stays up, and the dying
process is the only leader.

Each time both instances end cancelled with the baseline's histories (every key
holds its first value), the two signals are consumed once each by the two
receives, the transactional activity's own write committed exactly once, the
background step ran, the timed-out one never did, and nothing is left queued,
running or armed. Then ``prune`` beside live workers: a failed or interrupted
batch deletes nothing it should not, and the workflows in flight are untouched.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.operations import prune
from selvedge_django.testing import FAULT_EXIT_STATUS, FaultInjector, InjectedFault, Statement
from selvedge_django.worker import Worker
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger
from tests.testapp.workflows.faults import FAULT_BG_QUEUE

from .test_crash_matrix import (
    CONTROL,
    SUBPROCESS_OVERRIDES,
    WORKER_LEASE,
    WRITE,
    Step,
    crashing_env,
    normalised_history,
    shape,
)

FLOW = "fault.flow2"
WORKFLOW_ONLY: dict[str, Any] = {
    "activity_queues": [""],
    "lease": WORKER_LEASE,
    "run_local_starts": False,
    "execution_error_backoff": 0.05,
}
ACTIVITY_ONLY: dict[str, Any] = {
    "activity_queues": [FAULT_BG_QUEUE],
    "lease": WORKER_LEASE,
    "run_local_starts": False,
}
# The child's key: its id is <parent id>/<key> in every run.
CHILD_KEY = "#7:child:fault.waiter"


@dataclass(frozen=True)
class Target:
    """One call of a durable operation (``call`` counts that operation's calls on the
    role's instance; for batch operations, ``role`` None, the first call that did work)."""

    label: str
    operation: str
    role: str | None
    call: int = 1
    in_process_only: bool = False  # the activity-only worker's, which never runs apart
    mid_transaction: bool = False
    # A crash after the commit, or a failed statement, may end the run one step earlier:
    # the request is made by an attempt that is not the execution's inline one (the
    # crashed process's attempt, or the retry of the failed attempt, which runs in the
    # background), so the resumed execution may observe the request at the cancel_self
    # activity, before that attempt's completion is recorded, instead of at the receive
    # after it. Which one comes first is a race; both end the run as the baseline does.
    cancelled_at_activity: bool = False

    def __str__(self) -> str:
        return self.label


TARGETS = [
    Target("transactional complete", "complete_task", "parent", mid_transaction=True),
    Target("condition delivery", "observe", "parent", call=1),
    Target("releasing reservation", "reserve_activity", "parent", call=2),
    Target("background claim", "claim_tasks", None, in_process_only=True),
    Target("leader sweep", "sweep_activity_timeouts", None),
    Target("cancel request", "request_cancel", "parent", cancelled_at_activity=True),
    Target("cancelled close", "close", "parent", mid_transaction=True),
    Target("child close", "close", "child"),
]
IN_PROCESSES = [t for t in TARGETS if not t.in_process_only]
MID_TRANSACTION = [t for t in TARGETS if t.mid_transaction]


def role_instance(role: str | None, parent: str) -> str | None:
    return {"parent": parent, "child": f"{parent}/{CHILD_KEY}", None: None}[role]


@contextlib.contextmanager
def activity_only_worker() -> Iterator[Worker]:
    """A worker that only claims and runs FAULT_BG_QUEUE's tasks (and renews them)."""
    worker = Worker(**ACTIVITY_ONLY)
    worker.loops = [worker.activity_poller, worker.renewer]
    with worker:
        yield worker


@contextlib.contextmanager
def workers() -> Iterator[None]:
    with activity_only_worker(), Worker(**WORKFLOW_ONLY):
        yield


# -- the baseline -----------------------------------------------------------------------


class Baseline:
    """The statements of one traced, fault-free run of fault.flow2."""

    def __init__(self, parent: str, statements: list[Statement]) -> None:
        self.parent = parent
        self.statements = statements
        self.history = histories(parent)
        self.signals = consumed(parent)

    def steps(self, target: Target) -> list[Step]:
        instance = role_instance(target.role, self.parent)
        calls: dict[int, list[Statement]] = {}
        for s in self.statements:
            if s.operation == target.operation and (instance is None or s.instance_id == instance):
                calls.setdefault(s.call, []).append(s)
        ordered = [
            calls[c] for c in sorted(calls, key=lambda c: self.statements.index(calls[c][0]))
        ]
        if target.role is None:
            working = [c for c in ordered if any(WRITE.match(s.sql) for s in c)]
            assert working, f"the baseline never saw {target.operation} do any work"
            return [Step(s.step, s.sql, 1) for s in working[0]]
        assert len(ordered) >= target.call, f"baseline has {len(ordered)} {target.operation} calls"
        chosen = ordered[target.call - 1]
        before = [s for c in ordered[: target.call - 1] for s in c]
        steps = []
        for s in chosen:
            earlier = sum(1 for b in before if shape(b.sql) == shape(s.sql))
            earlier += sum(1 for c in chosen[: s.step - 1] if shape(c.sql) == shape(s.sql))
            steps.append(Step(s.step, s.sql, earlier + 1))
        return steps


_baselines: dict[str, Baseline] = {}


def baseline() -> Baseline:
    vendor = connection.vendor
    if vendor not in _baselines:
        parent = f"baseline2-{uuid.uuid4().hex[:8]}"
        injector = FaultInjector(trace=True).install()
        try:
            with workers():
                run_flow(parent)
        finally:
            injector.uninstall()
        found = Baseline(parent, list(injector.statements))
        check_run(parent, None)
        _baselines[vendor] = found
    return _baselines[vendor]


# -- running and checking ---------------------------------------------------------------


def start_flow(parent: str, *, retry_faults: bool = True) -> None:
    """Start fault.flow2 with its two signals in one transaction (again after a fault)."""
    for attempt in range(2):
        try:
            with transaction.atomic():
                sv.start_workflow(FLOW, {"tag": parent}, instance_id=parent)
                sv.signal(parent, "w", 1)
                sv.signal(parent, "w", 2)
            return
        except InjectedFault:
            assert retry_faults and attempt == 0


def finish(parent: str) -> None:
    """Wait until both instances are closed."""
    assert sv.wait_workflow(parent, timeout=60).status == "cancelled"
    child = wait_until(lambda: WorkflowInstance.objects.filter(parent_instance_id=parent).first())
    assert sv.wait_workflow(child.instance_id, timeout=60).status == "cancelled"


def run_flow(parent: str) -> None:
    start_flow(parent)
    finish(parent)


def histories(parent: str) -> dict[str, list[tuple[str, str, str, Any]]]:
    return {
        role: normalised_history(role_instance(role, parent) or "", parent)
        for role in ("parent", "child")
    }


def consumed(parent: str) -> list[tuple[str, str]]:
    return list(
        SignalMessage.objects.filter(instance_id=parent)
        .order_by("id")
        .values_list("payload", "consumed_key")
    )


def cancelled_at_activity(history: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The baseline's histories had the cancellation been observed at cancel_self."""
    *rows, receive, close = history["parent"]
    key, command, _, _ = rows[-1]
    assert (key, receive[0]) == ("#8:fault.cancel_self", "#9:receive:never")
    rows[-1] = (key, command, "ActivityCancelled", close[3])
    return {**history, "parent": [*rows, close]}


def check_run(parent: str, reference: Baseline | None, *, early: bool = False) -> None:
    """Everything this matrix promises about one finished run of fault.flow2 (``early``:
    the cancellation may have been observed one step before the baseline's)."""
    child_id = role_instance("child", parent)
    inst = WorkflowInstance.objects.get(instance_id=parent)
    child = WorkflowInstance.objects.get(instance_id=child_id)
    assert child.parent_instance_id == parent
    assert (inst.status, child.status) == ("cancelled", "cancelled"), inst.error or child.error
    error = sv.get_workflow_result(parent).error
    assert isinstance(error, sv.WorkflowCancelled) and error.reason == "flow2 is done"
    if reference is not None:
        expected = [reference.history]
        if early:
            expected.append(cancelled_at_activity(reference.history))
        assert histories(parent) in expected
        assert consumed(parent) == reference.signals
    sv.replay_instance(parent)
    sv.replay_instance(child.instance_id)
    # Both signals, consumed once each (by the two receives after the condition).
    signals = consumed(parent)
    assert [payload for payload, _ in signals] == ["1", "2"]
    assert len({key for _, key in signals}) == 2 and all(key for _, key in signals)
    # The transactional activity's own write committed exactly once; the background step
    # ran (at least once); the task that timed out before a worker took it never ran.
    assert Ledger.objects.filter(entry=f"fault.tx:{parent}:tx").count() == 1
    assert Ledger.objects.filter(entry__startswith=f"fault:{parent}:bg:").exists()
    assert not Ledger.objects.filter(entry__startswith=f"fault:{parent}:late:").exists()
    tasks = ActivityTask.objects.filter(instance_id__in=[parent, child.instance_id])
    assert not tasks.filter(status__in=("queued", "running")).exists()
    late = tasks.get(key__endswith=":fault.step", input__contains=":late")
    assert late.status == "failed" and late.attempts == 0
    for closed in (inst, child):
        assert closed.closed_at is not None and closed.lease_owner == ""
        assert (
            HistoryEvent.objects.filter(instance_id=closed.instance_id, key="$close").count() == 1
        )
    assert not TimerSubscription.objects.filter(instance_id__in=[parent, child.instance_id])


@pytest.fixture
def tagged() -> Callable[[str], str]:
    def make(label: str) -> str:
        return f"crash2-{label.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"

    return make


# -- a failed statement at every step, in process ---------------------------------------


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_a_failing_statement_at_each_step_rolls_back_and_the_run_ends_as_planned(
    tdb: None, target: Target, tagged: Callable[[str], str]
) -> None:
    reference = baseline()
    steps = reference.steps(target)
    assert steps
    size = 4 if target.role is not None else 1
    rounds = [steps[n : n + size] for n in range(0, len(steps), size)]
    injector = FaultInjector().install()
    try:
        with workers():
            for batch in rounds:
                armed = {}
                for step in batch:
                    parent = tagged(f"{target.label}-{step.step}")
                    armed[parent] = (
                        step,
                        injector.fail_statement(
                            step.pattern,
                            step.nth,
                            operation=target.operation,
                            instance_id=role_instance(target.role, parent),
                        ),
                    )
                for parent in armed:
                    start_flow(parent)
                for parent, (step, fault) in armed.items():
                    finish(parent)
                    assert fault.fired == 1, f"step {step.step} ({step.sql[:60]}) never ran"
                injector.faults.clear()
                for parent in armed:
                    check_run(parent, reference, early=target.cancelled_at_activity)
    finally:
        injector.uninstall()


# -- a real process exiting at a step ----------------------------------------------------


def crash_then_recover(
    target: Target,
    parent: str,
    arm: Callable[[FaultInjector, Step], None],
    worker_process: Callable[..., WorkerProcess],
) -> None:
    """Run fault.flow2 in a workflow-only process that a fault ends; finish in process."""
    steps = baseline().steps(target)
    work = [s for s in steps if not CONTROL.match(s.sql)]
    if target.role is None:
        work = [s for s in work if WRITE.match(s.sql)]
    injector = FaultInjector()
    arm(injector, work[-1])
    with activity_only_worker():
        proc = worker_process(env=crashing_env(injector))
        start_flow(parent, retry_faults=False)
        status = proc.proc.wait(60)
        output = proc.output()
        assert proc.proc.stdout is not None
        proc.proc.stdout.close()
        assert status == FAULT_EXIT_STATUS, output
        with Worker(**WORKFLOW_ONLY):
            finish(parent)


@pytest.mark.slow
@pytest.mark.parametrize("target", IN_PROCESSES, ids=str)
def test_a_process_exiting_right_after_each_commit_loses_and_doubles_nothing(
    tdb: None,
    target: Target,
    tagged: Callable[[str], str],
    worker_process: Callable[..., WorkerProcess],
) -> None:
    parent = tagged(target.label)

    def arm(injector: FaultInjector, last: Step) -> None:
        injector.exit_after_commit(
            last.pattern,
            last.nth,
            operation=target.operation,
            instance_id=role_instance(target.role, parent),
            min_rows=1 if target.role is None else None,
        )

    crash_then_recover(target, parent, arm, worker_process)
    check_run(parent, baseline(), early=target.cancelled_at_activity)


@pytest.mark.slow
@pytest.mark.parametrize("target", MID_TRANSACTION, ids=str)
def test_a_process_exiting_inside_a_transaction_leaves_no_partial_write(
    tdb: None,
    target: Target,
    tagged: Callable[[str], str],
    worker_process: Callable[..., WorkerProcess],
) -> None:
    parent = tagged(target.label)

    def arm(injector: FaultInjector, last: Step) -> None:
        injector.exit_at_statement(
            last.pattern,
            last.nth,
            operation=target.operation,
            instance_id=role_instance(target.role, parent),
        )

    crash_then_recover(target, parent, arm, worker_process)
    check_run(parent, baseline())


# -- prune beside live workers -----------------------------------------------------------

# The deletes of a prune batch (the tables an instance owns, then the instances): Django's
# cascade names the instances in an IN list; the workers' own deletes never do.
PRUNE_DELETE = r'^DELETE FROM "\w+" WHERE "\w+"\."instance_id" IN \('
PRUNE_INSTANCES = r'^DELETE FROM "selvedge_django_workflowinstance" WHERE'


def closed_long_ago(count: int) -> dict[str, int]:
    """``count`` completed instances that closed a year ago, with their history sizes."""
    ids = [sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3}) for _ in range(count)]
    for iid in ids:
        assert sv.wait_workflow(iid, timeout=30).status == "completed"
    WorkflowInstance.objects.filter(instance_id__in=ids).update(
        closed_at=timezone.now() - timedelta(days=365)
    )
    return {iid: HistoryEvent.objects.filter(instance_id=iid).count() for iid in ids}


def in_flight(count: int) -> list[str]:
    """fault.flow instances (each with a child) started to run beside the prune."""
    tag = uuid.uuid4().hex[:6]
    ids = []
    for n in range(count):
        iid = f"prune-live-{tag}-{n}"
        with transaction.atomic():
            sv.start_workflow("fault.flow", {"tag": iid}, instance_id=iid)
            sv.signal(iid, "go", 1)
            sv.signal(iid, "go", 2)
        ids.append(iid)
    return ids


def whole_or_untouched(old: dict[str, int]) -> int:
    """Check that every old instance is either gone with all it owned or untouched; return
    how many remain."""
    remaining = set(
        WorkflowInstance.objects.filter(instance_id__in=list(old)).values_list(
            "instance_id", flat=True
        )
    )
    for iid, events in old.items():
        owned = HistoryEvent.objects.filter(instance_id=iid).count()
        assert owned == (events if iid in remaining else 0), iid
    return len(remaining)


def check_live(live: list[str]) -> None:
    from tests.processes.test_crash_matrix import check_run as check_flow
    from tests.processes.test_crash_matrix import expected_tasks

    for iid in live:
        assert sv.wait_workflow(iid, timeout=60).status == "completed"
    for iid in live:
        check_flow(iid, None, expected_tasks({}))


def test_a_failing_prune_batch_deletes_nothing_and_live_workflows_carry_on(tdb: None) -> None:
    with Worker(**WORKFLOW_ONLY):
        old = closed_long_ago(6)
        live = in_flight(3)
        # Each delete of the first batch fails in turn (the sixth is that of the second
        # batch, or nothing): a batch is deleted whole or not at all, and the instances
        # that run meanwhile are never touched.
        for n in range(1, 7):
            with FaultInjector() as injector:
                fault = injector.fail_statement(PRUNE_DELETE, nth=n)
                with contextlib.suppress(InjectedFault):
                    prune(timedelta(days=30), batch_size=4)
            assert whole_or_untouched(old) in (6, 2, 0)
            if n == 1:
                assert fault.fired == 1 and whole_or_untouched(old) == 6
        prune(timedelta(days=30), batch_size=4)
        assert whole_or_untouched(old) == 0
        check_live(live)


@pytest.mark.slow
def test_a_prune_process_exiting_after_a_batch_commits_leaves_live_work_alone(
    tdb: None,
) -> None:
    from tests.processes.test_crash_matrix import run_client

    with Worker(**WORKFLOW_ONLY):
        old = closed_long_ago(6)
        live = in_flight(3)
        injector = FaultInjector()
        injector.exit_after_commit(PRUNE_INSTANCES, min_rows=1)
        env = {**injector.to_env(), "SELVEDGE_TEST_OVERRIDES": json.dumps(SUBPROCESS_OVERRIDES)}
        done = run_client(["prune", "--older-than", "30d", "--batch-size", "4"], env)
        assert done.returncode == FAULT_EXIT_STATUS, done.stdout + done.stderr
        # The first batch committed whole before the process died; the rest is untouched.
        assert whole_or_untouched(old) == 2
        done = run_client(["prune", "--older-than", "30d", "--batch-size", "4"], {})
        assert done.returncode == 0, done.stdout + done.stderr
        assert whole_or_untouched(old) == 0
        check_live(live)
