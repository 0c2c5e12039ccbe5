"""The crash matrix: a fault at every step of every durable operation, then recovery.

``fault.flow`` (tests/testapp/workflows/faults.py) takes every kind of durable step
once: an inline activity, a retried one (background claim), a timer, a receive
and a timed receive, a child, a cancelled scope, the close. A traced run of it
(the *baseline*) tells, per database, which SQL statements each store
operation issues. Then, for each target operation:

* every statement of its transaction is made to fail in turn
  (``FaultInjector.fail_statement``) in an in-process worker: the transaction
  rolls back and the worker carries on;
* a real ``runselvedge worker`` process exits (``os._exit``) right after the
  operation commits, and for some operations in the middle of its transaction;
  a new worker takes over once the dead one's leases lapse;
* for the writes that carry an inline attempt's result (it commits with the
  execution's next write), a process exits between the attempt and that write.

Each time the workflow completes with the baseline's output, every history key
holds its first value (same keys, commands, event types and values as the
baseline, and the history replays), both signals are consumed once each, no
task ran after the close, and attempts and retry budgets are what the seeds
define: an interrupted claim costs nothing, a lapsed claim (the claimer died
holding it) is one attempt and one failure, a completion that could not be
recorded is one failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection, transaction

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.testing import (
    FAULT_EXIT_STATUS,
    FaultInjector,
    InjectedFault,
    Statement,
)
from selvedge_django.worker import Worker
from tests.conftest import ROOT, WorkerProcess
from tests.testapp.models import Ledger

# The processes that crash hold leases and claims for one second, so that the next
# worker takes over soon; in-process workers keep theirs longer, so that a loaded
# machine does not make them lose a lease (which would cost an extra attempt).
SHORT_LEASE = {"TTL": 1.0, "RENEW_INTERVAL": 0.25, "MARGIN": 0.25, "MAX_SKEW": 0.1}
WORKER_LEASE = {"TTL": 3.0, "RENEW_INTERVAL": 0.5, "MARGIN": 0.5, "MAX_SKEW": 0.25}
# The default queue only: the cancelled scope's task (fault.parked) is never served.
# Starts go through dispatch (not handed to the in-process worker, whose free slots
# vary between runs), so that every run issues the same statements as the baseline;
# tests/processes/test_local_start_processes.py crashes the handed-over start on its own.
WORKER_OPTIONS: dict[str, Any] = {
    "activity_queues": [""],
    "lease": WORKER_LEASE,
    "run_local_starts": False,
    # An execution that a failed statement ends runs again soon (held back, not at once).
    "execution_error_backoff": 0.05,
}
SUBPROCESS_OVERRIDES = {
    "LEASE": SHORT_LEASE,
    "ACTIVITY_QUEUES": [""],
    "LEADER_LEASE_DURATION": 2,
    "LEADER_HEARTBEAT_INTERVAL": 0.5,
}
EXPECTED_OUTPUT = {
    "first": "{tag}:first",
    "flaky": "{tag}:flaky",
    "signals": [1, 2],
    "child": "child:{tag}:child",
    "cancelled": 2,
}
CHILD_KEY = "#6:child:fault.child"
# Task -> (instance role, history key). Baseline: (attempts, failures, runs of the body).
TASKS = {
    "first": ("parent", "#1:fault.step"),
    "flaky": ("parent", "#2:fault.step"),
    "parked": ("parent", "#8:fault.step"),
    "child": ("child", "#1:fault.step"),
}
BASELINE_TASKS = {
    "first": ("completed", 1, 0, 1),
    "flaky": ("completed", 2, 1, 2),
    "parked": ("cancelled", 0, 0, 0),
    "child": ("completed", 1, 0, 1),
}


def child_id(parent: str) -> str:
    return f"{parent}/{CHILD_KEY}"


def role_instance(role: str | None, parent: str) -> str | None:
    return {"parent": parent, "child": child_id(parent), None: None}[role]


@dataclass(frozen=True)
class Target:
    """One call of a durable operation: ``call`` counts that operation's calls on the
    role's instance (batch operations, ``role`` None: the first call that did work)."""

    label: str
    operation: str
    role: str | None
    call: int = 1
    client: bool = False
    # Task -> (status, attempts, failures, runs) where the crash changes the baseline.
    after_commit: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)
    mid_transaction: dict[str, tuple[str, int, int, int]] | None = None
    failed_statement: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.label


ONE_STATEMENT_RECEIVE = connection.vendor == "postgresql"
RECEIVE_OPERATION = "receive_next" if ONE_STATEMENT_RECEIVE else "observe"
OBSERVE_CALLS = (1, 2) if ONE_STATEMENT_RECEIVE else (2, 3)

TARGETS = [
    Target("start", "create_instance", "parent", client=True),
    Target("signal", "append_signal", "parent", client=True),
    Target("dispatch", "lease_batch", None),
    Target(
        "reserve",
        "reserve_activity",
        "parent",
        # The inline claim committed with the reservation: the dead process held it.
        after_commit={"first": ("completed", 2, 1, 1)},
    ),
    Target(
        "inline result",
        "reserve_activity",
        "parent",
        call=2,
        # The first step's inline result commits with the second's reservation: lost with
        # it, the first step runs again (its claim lapsed: one attempt, one failure); after
        # the commit, the second step's inline claim is what the dead process held.
        after_commit={"flaky": ("completed", 2, 1, 1)},
        mid_transaction={"first": ("completed", 2, 1, 2)},
    ),
    Target(
        "complete",
        "complete_task",
        "parent",
        # The retried step's background completion (inline results commit with the next
        # write: see "inline result").
        mid_transaction={"flaky": ("completed", 3, 2, 3)},
        # A failed statement is retried by the attempt itself: no second run, no failure.
    ),
    Target("retry", "retry_task", "parent"),
    Target(
        "claim",
        "claim_tasks",
        None,
        after_commit={"flaky": ("completed", 3, 2, 2)},
        mid_transaction={},
    ),
    Target("suspend", "release_lease", "parent"),
    Target("timer reserve", "reserve_timer", "parent"),
    Target("timer fire", "fire_due_timers", None),
    # On PostgreSQL a plain receive is its own operation (reads and observation in one
    # statement); the timed receive and the scope cancel observe.
    Target("receive", RECEIVE_OPERATION, "parent", call=1, mid_transaction={}),
    Target("timed receive", "observe", "parent", call=OBSERVE_CALLS[0]),
    Target("child start", "start_child", "parent", mid_transaction={}),
    # The child's close also records its inline step's result.
    Target("child close", "close", "child", mid_transaction={"child": ("completed", 2, 1, 2)}),
    Target("scope cancel", "observe", "parent", call=OBSERVE_CALLS[1]),
    Target("close", "close", "parent", mid_transaction={}),
]
MID_TRANSACTION = [t for t in TARGETS if t.mid_transaction is not None]


# -- the baseline -----------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One statement of a target call, and how to pick it out in another run."""

    step: int
    sql: str
    nth: int

    @property
    def pattern(self) -> str:
        escaped = re.escape(shape(self.sql))
        escaped = escaped.replace("SAVEPOINT_ID", r"s\d+_x\d+")
        escaped = escaped.replace("NAME_ROWS", rf"\({MARK}\)(?:,\ \({MARK}\))*")
        return "^" + escaped.replace("PARAMETERS", rf"{MARK}(?:,\ {MARK})*") + "$"


CONTROL = re.compile(r"^(BEGIN|SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK|SELECT pg_notify)\b")
# One parameter mark of a list: positional, or named and numbered (storage.sql.marks).
MARK = r"(?:%s|%\(\w+?_\d+\)s)"


def shape(sql: str) -> str:
    """The SQL text with what changes between runs masked: savepoint names, and the length
    of ``IN`` lists and of the claim's ``VALUES`` list of names (the registered workflows
    and activities differ between this process and a worker's: a test module collected
    with this one registers more), their marks positional or numbered by name."""
    sql = re.sub(r"\bs\d+_x\d+\b", "SAVEPOINT_ID", sql)
    sql = re.sub(rf"VALUES (?:\({MARK}\), )*\({MARK}\)", "VALUES NAME_ROWS", sql)
    return re.sub(rf"IN \((?:{MARK}, )*{MARK}\)", "IN (PARAMETERS)", sql)


def test_a_step_pattern_matches_its_statement_whatever_the_length_of_its_lists() -> None:
    """The worker process serves fewer workflows and activities than the traced run."""
    traced = (
        "WITH n (name) AS (VALUES (%(name_0)s), (%(name_1)s), (%(name_2)s))"
        " SELECT id FROM t WHERE queue IN (%(queue_0)s) AND workflow_name IN (%s, %s)"
    )
    fewer = (
        "WITH n (name) AS (VALUES (%(name_0)s))"
        " SELECT id FROM t WHERE queue IN (%(queue_0)s, %(queue_1)s) AND workflow_name IN (%s)"
    )
    pattern = re.compile(Step(1, traced, 1).pattern, re.IGNORECASE | re.DOTALL)
    assert pattern.search(traced) and pattern.search(fewer)
    assert not pattern.search(fewer.replace("queue IN", "queue NOT IN"))


class Baseline:
    """The statements of one traced, fault-free run of fault.flow."""

    def __init__(self, parent: str, statements: list[Statement]) -> None:
        self.parent = parent
        self.statements = statements
        self.history = histories(parent)

    def _calls(self, operation: str, instance: str | None) -> list[list[Statement]]:
        calls: dict[int, list[Statement]] = {}
        for s in self.statements:
            if s.operation == operation and (instance is None or s.instance_id == instance):
                calls.setdefault(s.call, []).append(s)
        return [calls[c] for c in sorted(calls, key=lambda c: self.statements.index(calls[c][0]))]

    def steps(self, target: Target) -> list[Step]:
        """The target call's statements, each with its rank among the same SQL."""
        instance = role_instance(target.role, self.parent)
        calls = self._calls(target.operation, instance)
        if target.role is None:
            working = [c for c in calls if any(WRITE.match(s.sql) for s in c)]
            assert working, f"the baseline never saw {target.operation} do any work"
            # Batch operations also run while idle: pick each statement's first occurrence.
            return [Step(s.step, s.sql, 1) for s in working[0]]
        assert len(calls) >= target.call, f"baseline has {len(calls)} {target.operation} calls"
        chosen = calls[target.call - 1]
        before = [s for c in calls[: target.call - 1] for s in c]
        steps = []
        for s in chosen:
            earlier = sum(1 for b in before if shape(b.sql) == shape(s.sql))
            earlier += sum(1 for c in chosen[: s.step - 1] if shape(c.sql) == shape(s.sql))
            steps.append(Step(s.step, s.sql, earlier + 1))
        return steps


_baselines: dict[str, Baseline] = {}


def client_steps(operation: str) -> list[Step]:
    """The statements of a start or a signal (``operation``: ``create_instance`` or
    ``append_signal``) made as ``runselvedge start`` or ``signal`` makes it: outside any
    transaction (on PostgreSQL one statement), where the baseline's start and signals,
    made in one transaction, run as transactions of two. Traced on an instance of its
    own, terminated after."""
    scratch = f"scratch-{uuid.uuid4().hex[:8]}"
    starting = operation == "create_instance"
    if not starting:
        sv.start_workflow("fault.flow", {"tag": scratch}, instance_id=scratch)
    injector = FaultInjector(trace=True).install()
    try:
        if starting:
            sv.start_workflow("fault.flow", {"tag": scratch}, instance_id=scratch)
        else:
            sv.signal(scratch, "go", 1)
    finally:
        injector.uninstall()
    sv.terminate_workflow(scratch, "traced a client call")
    traced = [s for s in injector.statements if s.operation == operation]
    assert traced, f"the traced client call ran no {operation} statement"
    return [Step(s.step, s.sql, 1) for s in traced]


def baseline() -> Baseline:
    """Trace one fault-free run on this database (once per test run and vendor)."""
    vendor = connection.vendor
    if vendor not in _baselines:
        parent = f"baseline-{uuid.uuid4().hex[:8]}"
        injector = FaultInjector(trace=True).install()
        try:
            with Worker(**WORKER_OPTIONS):
                result = run_flow(parent)
        finally:
            injector.uninstall()
        assert result.status == "completed", result.error
        found = Baseline(parent, list(injector.statements))
        check_run(parent, found, BASELINE_TASKS)
        _baselines[vendor] = found
    return _baselines[vendor]


# -- running and checking ---------------------------------------------------------------


def start_flow(parent: str, *, retry_faults: bool = True) -> None:
    """Start fault.flow with its two signals in one transaction (again after a fault).

    Committing them together keeps runs alike: the first execution sees both signals.
    """
    for attempt in range(2):
        try:
            with transaction.atomic():
                sv.start_workflow("fault.flow", {"tag": parent}, instance_id=parent)
                sv.signal(parent, "go", 1)
                sv.signal(parent, "go", 2)
            return
        except InjectedFault:
            assert retry_faults and attempt == 0
            assert not WorkflowInstance.objects.filter(instance_id=parent).exists()
            assert not SignalMessage.objects.filter(instance_id=parent).exists()


def run_flow(parent: str) -> sv.WorkflowResult:
    start_flow(parent)
    return sv.wait_workflow(parent, timeout=60)


def histories(parent: str) -> dict[str, list[tuple[str, str, str, Any]]]:
    """The parent's and the child's normalised histories."""
    return {
        role: normalised_history(role_instance(role, parent) or "", parent)
        for role in ("parent", "child")
    }


def normalised_history(instance_id: str, parent: str) -> list[tuple[str, str, str, Any]]:
    """Keys, commands, event types and values; times and ids made run-independent."""
    rows = []
    found = HistoryEvent.objects.filter(instance_id=instance_id)
    for row in sorted(found, key=lambda r: (r.seq is None, r.seq or 0, r.id)):
        value: Any = json.loads(row.data) if row.data is not None else None
        if row.command in ("sleep",) or row.event_type == "ScopeCancelled":
            value = "<time>" if row.event_type == "TimerExpired" else row.event_type
        elif isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "traceback"}
        rows.append((row.key, row.command, row.event_type, _untag(value, parent)))
    return rows


def _untag(value: Any, parent: str) -> Any:
    text = json.dumps(value, sort_keys=True).replace(parent, "<id>")
    return json.loads(text)


def check_run(
    parent: str,
    reference: Baseline | None,
    tasks: dict[str, tuple[str, int, int, int]],
) -> None:
    """Everything the crash matrix promises about one finished run of fault.flow."""
    inst = WorkflowInstance.objects.get(instance_id=parent)
    child = WorkflowInstance.objects.get(instance_id=child_id(parent))
    assert (inst.status, child.status) == ("completed", "completed"), inst.error or child.error
    expected = json.loads(json.dumps(EXPECTED_OUTPUT).replace("{tag}", parent))
    assert json.loads(inst.output or "null") == expected
    # Each history key holds its first value: the same history as a run without faults,
    # and replaying it gives the recorded outcome.
    if reference is not None:
        assert histories(parent) == reference.history
    sv.replay_instance(parent)
    sv.replay_instance(child.instance_id)
    # Both signals were consumed, once each, by the two receives.
    consumed = list(
        SignalMessage.objects.filter(instance_id=parent)
        .order_by("id")
        .values_list("payload", "consumed_key")
    )
    assert consumed == [("1", "#4:receive:go"), ("2", "#5:receive:go")]
    # Attempts and retry budgets.
    for name, (role, key) in TASKS.items():
        task = ActivityTask.objects.get(instance_id=role_instance(role, parent), key=key)
        runs = Ledger.objects.filter(entry__startswith=f"fault:{parent}:{name}:").count()
        assert (task.status, task.attempts, task.failures, runs) == tasks[name], name
    # Nothing ran, or is left to run, after the close; nothing is held.
    for closed in (inst, child):
        assert closed.closed_at is not None and closed.lease_owner == ""
        closes = HistoryEvent.objects.filter(instance_id=closed.instance_id, key="$close")
        assert closes.count() == 1
    assert not TimerSubscription.objects.filter(instance_id__in=[parent, child.instance_id])
    assert not ActivityTask.objects.filter(
        instance_id__in=[parent, child.instance_id], status__in=("queued", "running")
    )
    last_run = (
        Ledger.objects.filter(entry__startswith=f"fault:{parent}:")
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    assert last_run is not None and inst.closed_at is not None and last_run <= inst.closed_at


def expected_tasks(changes: dict[str, tuple[str, int, int, int]]) -> dict[str, Any]:
    return {**BASELINE_TASKS, **changes}


@pytest.fixture
def tagged() -> Iterator[Callable[[str], str]]:
    def make(label: str) -> str:
        return f"crash-{label.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"

    yield make


# -- a failed statement at every step, in process ---------------------------------------


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_a_failing_statement_at_each_step_rolls_back_and_the_workflow_completes(
    tdb: None, target: Target, tagged: Callable[[str], str]
) -> None:
    reference = baseline()
    steps = reference.steps(target)
    assert steps
    # Faults on one instance's operations run four at a time (each fault only sees its
    # own instance); batch operations and client calls run one step at a time.
    size = 4 if target.role is not None and not target.client else 1
    rounds = [steps[n : n + size] for n in range(0, len(steps), size)]
    injector = FaultInjector().install()
    # Completions that finish together commit in one transaction (worker.group_commit),
    # whose BEGIN belongs to no one completion: one activity at a time keeps each
    # completion in a transaction of its own, where the step's fault can strike.
    alone = {"max_concurrent_activities": 1} if target.operation == "complete_task" else {}
    try:
        with Worker(**WORKER_OPTIONS, **alone):
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
                    result = sv.wait_workflow(parent, timeout=60)
                    assert fault.fired == 1, f"step {step.step} ({step.sql[:60]}) never ran"
                    assert result.status == "completed", result.error
                injector.faults.clear()
                for parent in armed:
                    check_run(parent, reference, expected_tasks(target.failed_statement))
    finally:
        injector.uninstall()


# -- a real process exiting at a step ----------------------------------------------------


def crashing_env(injector: FaultInjector) -> dict[str, str]:
    return {**injector.to_env(), "SELVEDGE_TEST_OVERRIDES": json.dumps(SUBPROCESS_OVERRIDES)}


def run_client(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a ``runselvedge`` client subcommand on the test database."""
    import os

    full_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    if connection.vendor == "postgresql":
        full_env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    return subprocess.run(
        [sys.executable, "-m", "django", "runselvedge", *args],
        cwd=str(ROOT),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# A write (PostgreSQL's one-statement dispatch is a WITH ... UPDATE).
WRITE = re.compile(r"^(UPDATE|INSERT|DELETE|WITH)\b")


def crash_then_recover(
    target: Target,
    parent: str,
    arm: Callable[[FaultInjector, Step], None],
    worker_process: Callable[..., WorkerProcess],
    *,
    crash_before_start: bool = False,
) -> None:
    """Run fault.flow in a process that a fault ends, then finish it in a new worker.

    ``crash_before_start``: the worker process dies before the flow starts (a fault
    at its first poll, which runs the same statement whether it finds work or not),
    so that its other loops cannot take part of the flow before the poll's fault.
    """
    reference = baseline()
    steps = client_steps(target.operation) if target.client else reference.steps(target)
    injector = FaultInjector()
    # The last statement that does the operation's work (client calls run it outside the
    # test's transaction, without savepoints); for a batch operation, its last write,
    # which the injector can see change rows (an idle poll changes none).
    work = [s for s in steps if not CONTROL.match(s.sql)]
    if target.role is None:
        work = [s for s in work if WRITE.match(s.sql)]
    arm(injector, work[-1])
    env = crashing_env(injector)
    if target.client:
        # The client process (``runselvedge start`` / ``signal``) is the one that dies.
        if target.operation == "create_instance":
            args = ["start", "fault.flow", json.dumps({"tag": parent}), "--id", parent]
            done = run_client(args, env)
            assert done.returncode == FAULT_EXIT_STATUS, done.stdout + done.stderr
            with pytest.raises(sv.WorkflowAlreadyStarted):  # the start had committed
                sv.start_workflow("fault.flow", {"tag": parent}, instance_id=parent)
            sv.signal(parent, "go", 1)
        else:
            sv.start_workflow("fault.flow", {"tag": parent}, instance_id=parent)
            done = run_client(["signal", parent, "go", "1"], env)
            assert done.returncode == FAULT_EXIT_STATUS, done.stdout + done.stderr
        sv.signal(parent, "go", 2)
    else:
        # It may die before it prints "started": its claim loop polls at once, and the
        # claim's one statement is the same for a poll that finds the task as for one
        # that finds nothing.
        proc = worker_process(env=env, wait_started=False)
        if crash_before_start:
            status = proc.proc.wait(60)
            start_flow(parent, retry_faults=False)
        else:
            start_flow(parent, retry_faults=False)
            status = proc.proc.wait(60)
        output = proc.output()
        assert proc.proc.stdout is not None
        proc.proc.stdout.close()
        assert status == FAULT_EXIT_STATUS, output
    with Worker(**WORKER_OPTIONS):
        result = sv.wait_workflow(parent, timeout=60)
    assert result.status == "completed", result.error


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS, ids=str)
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
    check_run(parent, baseline(), expected_tasks(target.after_commit))


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
        # Just before the transaction's last statement: the database rolls back the rest.
        injector.exit_at_statement(
            last.pattern,
            last.nth,
            operation=target.operation,
            instance_id=role_instance(target.role, parent),
        )

    # On PostgreSQL a claim's fault strikes at the first poll (one statement, whether it
    # finds work or not): started after it, the flow cannot have an inline activity
    # claimed by the dying process's dispatcher first (a race that its dispatch, two
    # statements from the start, sometimes won). SQLite's poll claims only after a read
    # found work, so there the fault waits for the flow's first background task.
    first_poll = target.operation == "claim_tasks" and connection.vendor == "postgresql"
    crash_then_recover(target, parent, arm, worker_process, crash_before_start=first_poll)
    assert target.mid_transaction is not None
    check_run(parent, baseline(), expected_tasks(target.mid_transaction))


# The writes that carry an inline result (the first step's, with the second step's
# reservation; the child's, with its close).
INLINE_RESULTS = [t for t in TARGETS if t.label in ("inline result", "child close")]


@pytest.mark.slow
@pytest.mark.parametrize("target", INLINE_RESULTS, ids=str)
def test_a_process_exiting_between_an_inline_attempt_and_the_next_write_reruns_only_it(
    tdb: None,
    target: Target,
    tagged: Callable[[str], str],
    worker_process: Callable[..., WorkerProcess],
) -> None:
    """The attempt ran and returned; the process ends before the write that records its
    result begins: only that activity runs again, and nothing else is lost or doubled."""
    parent = tagged(f"between {target.label}")
    steps = [s for s in baseline().steps(target) if not CONTROL.match(s.sql)]

    def arm(injector: FaultInjector, last: Step) -> None:
        first = steps[0]
        injector.exit_at_statement(
            first.pattern,
            first.nth,
            operation=target.operation,
            instance_id=role_instance(target.role, parent),
        )

    crash_then_recover(target, parent, arm, worker_process)
    assert target.mid_transaction is not None
    check_run(parent, baseline(), expected_tasks(target.mid_transaction))
