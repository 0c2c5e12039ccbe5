"""``manage.py runselvedge`` operator subcommands, through ``call_command``.

Every subcommand prints JSON or one line per action and fails with
``CommandError`` (exit status 1 from the command line, checked with a real
process for ``replay-check``). ``prune`` deletes old closed instances with all
they own, in bounded batches, never a running instance nor a child whose parent
still runs; "old" instances are made by moving their close back in time.
``worker`` itself is exercised by the process tests
(tests/processes/test_worker_command.py and the others there).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.management.commands.runselvedge import StopSignals, parse_duration
from selvedge_django.models import (
    ActivityTask,
    HistoryEvent,
    SignalMessage,
    TimerSubscription,
    WorkflowInstance,
)
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests import ops_workflows

ROOT = Path(__file__).resolve().parents[2]
HISTORIES = Path(__file__).resolve().parents[1] / "histories"


@sv.workflow(name="ops.cmd.stubborn")
def stubborn(ctx: sv.WorkflowContext, _: Any) -> Any:
    """A child that ignores its parent's close: it waits for "go" in a detached scope."""
    return ctx.detached().receive("go")


@sv.workflow(name="ops.cmd.orphaning")
def orphaning(ctx: sv.WorkflowContext, _: Any) -> str:
    """Start a stubborn child and close without waiting for it."""
    return ctx.start_child(stubborn).id


# -- helpers ------------------------------------------------------------------------------


def run(*args: str) -> str:
    """Run ``runselvedge`` with ``args`` and return what it printed."""
    out = StringIO()
    call_command("runselvedge", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def fails(*args: str) -> tuple[str, str]:
    """Run a subcommand that must fail; return (its message, what it printed first)."""
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("runselvedge", *args, stdout=out, stderr=StringIO())
    return str(caught.value), out.getvalue()


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def stepper(clock: ControllableClock) -> Worker:
    return Worker()


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


def age(*instance_ids: str, days: float = 40) -> None:
    """Move instances' start and close back in time, as if they had run ``days`` ago."""
    then = timezone.now() - timedelta(days=days)
    WorkflowInstance.objects.filter(instance_id__in=instance_ids).update(
        started_at=then, closed_at=then
    )
    running = WorkflowInstance.objects.filter(instance_id__in=instance_ids, status="running")
    running.update(closed_at=None)


def owned(instance_id: str) -> dict[str, int]:
    """How many rows of each kind an instance owns."""
    return {
        "history": HistoryEvent.objects.filter(instance_id=instance_id).count(),
        "tasks": ActivityTask.objects.filter(instance_id=instance_id).count(),
        "signals": SignalMessage.objects.filter(instance_id=instance_id).count(),
        "timers": TimerSubscription.objects.filter(instance_id=instance_id).count(),
    }


def exists(instance_id: str) -> bool:
    return WorkflowInstance.objects.filter(instance_id=instance_id).exists()


# -- start, describe, result -----------------------------------------------------------------


def test_start_prints_the_id_and_records_the_input(stepper: Worker) -> None:
    assert run("start", "ops.echo", '{"a": [1, 2]}', "--id", "cmd-1") == "started cmd-1\n"
    generated = run("start", "ops.echo").split()
    assert generated[0] == "started" and len(generated[1]) == 32
    run_until_idle(stepper)
    assert sv.get_workflow_result("cmd-1").output == {"a": [1, 2]}
    assert sv.get_workflow_result(generated[1]).output is None
    assert sv.describe("cmd-1").priority == 0
    assert run("start", "ops.echo", "--id", "cmd-2", "--priority", "40") == "started cmd-2\n"
    assert sv.describe("cmd-2").priority == 40


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("start", "ops.echo", "{not json"), "input is not JSON"),
        (("start", "ops.echo", "1", "--id", "taken"), "taken"),
        (("start", "ops.echo", "1", "--id", "bad\x00id"), "control characters"),
        (("start", "ops.echo", "1", "--id", ""), "1 to 255"),
        (("start",), "name"),
        (("start", "ops.echo", "1", "--priority", "101"), "priority must be from -100 to 100"),
    ],
)
def test_start_failures(tdb: None, args: tuple[str, ...], message: str) -> None:
    sv.start_workflow("ops.echo", 0, instance_id="taken")
    error, _ = fails(*args)
    assert message in error
    assert WorkflowInstance.objects.count() == 1


def test_describe_prints_json(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.parent, instance_id="cmd-parent")
    run_until_idle(stepper)
    (child,) = WorkflowInstance.objects.filter(parent_instance_id="cmd-parent")
    doc = json.loads(run("describe", child.instance_id))
    assert doc["instance_id"] == child.instance_id
    assert (doc["workflow_name"], doc["status"]) == ("ops.echo", "completed")
    assert (doc["parent_instance_id"], doc["parent_key"]) == ("cmd-parent", child.parent_key)
    assert doc["cancel_requested"] is False
    assert set(doc) >= {"started_at", "updated_at", "cancel_reason"}


def test_result_prints_output_or_error(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.echo, {"x": 1}, instance_id="cmd-ok")
    sv.start_workflow(ops_workflows.fail, "it broke", instance_id="cmd-failed")
    sv.start_workflow(ops_workflows.wait, instance_id="cmd-running")
    run_until_idle(stepper)
    assert json.loads(run("result", "cmd-ok")) == {
        "instance_id": "cmd-ok",
        "status": "completed",
        "output": {"x": 1},
        "error": None,
    }
    failed = json.loads(run("result", "cmd-failed"))
    assert failed["status"] == "failed" and failed["output"] is None
    assert (failed["error"]["type"], failed["error"]["message"]) == ("OpsFailure", "it broke")
    assert json.loads(run("result", "cmd-running"))["status"] == "running"


@pytest.mark.parametrize(
    "args",
    [
        ("describe", "missing"),
        ("result", "missing"),
        ("export-history", "missing"),
        ("cancel", "missing"),
        ("signal", "missing", "go"),
    ],
)
def test_unknown_instances_are_command_errors(tdb: None, args: tuple[str, ...]) -> None:
    error, _ = fails(*args)
    assert error == "workflow instance 'missing' not found"


# -- export-history ------------------------------------------------------------------------


def test_export_history_to_stdout_and_to_a_file(stepper: Worker, tmp_path: Path) -> None:
    sv.start_workflow("ops.golden.order", {"sku": "tee", "quantity": 3}, instance_id="cmd-exp")
    run_until_idle(stepper)
    printed = run("export-history", "cmd-exp")
    history = sv.parse_history(printed)
    assert history.to_dict() == sv.export_history("cmd-exp").to_dict()
    target = tmp_path / "cmd-exp.json"
    assert run("export-history", "cmd-exp", "-o", str(target)) == (
        f"exported cmd-exp to {target}\n"
    )
    assert sv.parse_history(target.read_bytes()).to_dict() == history.to_dict()
    assert run("replay-check", str(target)).splitlines() == [
        f"ok {target}",
        "checked 1, diverged 0",
    ]


# -- cancel and signal ---------------------------------------------------------------------


def test_cancel(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.wait, instance_id="cmd-wait")
    sv.start_workflow(ops_workflows.echo, 1, instance_id="cmd-done")
    run_until_idle(stepper)
    assert run("cancel", "cmd-wait", "--reason", "operator said so") == (
        "cancel requested for cmd-wait\n"
    )
    description = sv.describe("cmd-wait")
    assert (description.cancel_requested, description.cancel_reason) == (
        True,
        "operator said so",
    )
    run_until_idle(stepper)
    assert sv.describe("cmd-wait").status == "cancelled"
    assert run("cancel", "cmd-wait") == "cancel requested for cmd-wait\n"  # already cancelled
    error, _ = fails("cancel", "cmd-done")
    assert error == "workflow instance 'cmd-done' is already completed"


def test_terminate(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.wait, instance_id="cmd-term")
    sv.start_workflow(ops_workflows.echo, 1, instance_id="cmd-term-done")
    run_until_idle(stepper)
    assert run("terminate", "cmd-term", "--reason", "hung") == "terminated cmd-term\n"
    error = sv.get_workflow_result("cmd-term").error
    assert isinstance(error, sv.WorkflowTerminated) and error.reason == "hung"
    assert run_until_idle(stepper) == 0
    message, _ = fails("terminate", "cmd-term")
    assert message == "workflow instance 'cmd-term' is already failed"
    message, _ = fails("terminate", "cmd-term-done")
    assert message == "workflow instance 'cmd-term-done' is already completed"
    message, _ = fails("terminate", "cmd-missing")
    assert message == "workflow instance 'cmd-missing' not found"


def test_signal(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.wait, instance_id="cmd-sig")
    sv.start_workflow(ops_workflows.wait, instance_id="cmd-null")
    run_until_idle(stepper)
    assert run("signal", "cmd-sig", "go", '{"n": 1}') == "signalled cmd-sig on 'go'\n"
    assert run("signal", "cmd-null", "go") == "signalled cmd-null on 'go'\n"
    run_until_idle(stepper)
    assert sv.get_workflow_result("cmd-sig").output == {"n": 1}
    assert sv.get_workflow_result("cmd-null").output is None
    error, _ = fails("signal", "cmd-sig", "go", "1")
    assert error == "workflow instance 'cmd-sig' is already completed"


def test_start_if_exists_return_and_signal_idempotency_key(stepper: Worker) -> None:
    assert run("start", "ops.wait", "--id", "cmd-idem", "--if-exists", "return") == (
        "started cmd-idem\n"
    )
    assert run("start", "ops.wait", "--id", "cmd-idem", "--if-exists", "return") == (
        "exists cmd-idem\n"
    )
    error, _ = fails("start", "ops.echo", "--id", "cmd-idem", "--if-exists", "return")
    assert "cmd-idem" in error  # another workflow's instance: still refused
    error, _ = fails("start", "ops.wait", "--id", "cmd-idem", "--if-exists", "replace")
    assert "invalid choice" in error
    run_until_idle(stepper)
    for _ in range(2):
        out = run("signal", "cmd-idem", "go", '{"n": 1}', "--idempotency-key", "retry-1")
        assert out == "signalled cmd-idem on 'go'\n"
    assert SignalMessage.objects.filter(instance_id="cmd-idem").count() == 1
    error, _ = fails("signal", "cmd-idem", "go", "--idempotency-key", "")
    assert "idempotency_key" in error
    assert WorkflowInstance.objects.filter(instance_id="cmd-idem").count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("signal", "cmd-w", "go", "{oops"), "payload is not JSON"),
        (("signal", "cmd-w", "", "1"), "1 to 255 UTF-8 bytes"),
        (("signal", "cmd-w", "é" * 128, "1"), "1 to 255 UTF-8 bytes"),
    ],
)
def test_signal_failures_write_nothing(tdb: None, args: tuple[str, ...], message: str) -> None:
    sv.start_workflow(ops_workflows.wait, instance_id="cmd-w")
    error, _ = fails(*args)
    assert message in error
    assert SignalMessage.objects.count() == 0


# -- replay-check ----------------------------------------------------------------------------


def test_replay_check_with_nothing_to_check(tdb: None) -> None:
    assert run("replay-check") == "checked 0, diverged 0\n"


def test_replay_check_replays_running_and_recent_instances(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.wait, instance_id="rc-running")
    sv.start_workflow(ops_workflows.echo, 1, instance_id="rc-recent")
    sv.start_workflow(ops_workflows.fail, "no", instance_id="rc-old")
    sv.start_workflow("ops.cmd.registered.nowhere", instance_id="rc-unregistered")
    run_until_idle(stepper)
    age("rc-old", days=10)
    lines = run("replay-check").splitlines()
    assert sorted(lines[:-1]) == ["ok rc-recent", "ok rc-running"]  # the default --recent 7d
    assert lines[-1] == "checked 2, diverged 0"
    assert "ok rc-old" in run("replay-check", "--recent", "30d")
    assert run("replay-check", "--recent", "0").splitlines() == [
        "ok rc-running",
        "checked 1, diverged 0",
    ]
    assert run("replay-check", "--limit", "1", "--recent", "30d").splitlines()[-1] == (
        "checked 2, diverged 0"  # one running and one closed
    )


def test_replay_check_reports_divergence_and_fails(stepper: Worker, scratch: Any) -> None:
    sv.start_workflow(ops_workflows.parent, instance_id="rc-changed")  # waits after a child
    sv.start_workflow(ops_workflows.echo, 5, instance_id="rc-fine")
    run_until_idle(stepper)

    def parent_changed(ctx: sv.WorkflowContext, _: Any) -> Any:
        ctx.now()  # a new first command
        return ops_workflows.parent.fn(ctx, _)

    scratch("ops.parent", parent_changed)
    error, printed = fails("replay-check")
    assert error == "1 of 3 histories diverged"  # the parent, its child and rc-fine
    lines = printed.splitlines()
    assert "ok rc-fine" in lines
    (diverged,) = [line for line in lines if line.startswith("DIVERGED")]
    assert diverged.startswith("DIVERGED rc-changed: replay of 'rc-changed' diverged")
    assert lines[lines.index(diverged) + 1].startswith("    NondeterminismError: command 1")
    assert lines[-1] == "checked 3, diverged 1"


def test_replay_check_of_history_files(tdb: None, tmp_path: Path) -> None:
    good = [str(HISTORIES / n) for n in ("order_completed.json", "order_running.json")]
    assert run("replay-check", *good).splitlines() == [
        *(f"ok {path}" for path in good),
        "checked 2, diverged 0",
    ]
    bad = {
        name: str(HISTORIES / name)
        for name in (
            "order_asked_first.json",
            "order_in_euros.json",
            "malformed_wrong_type.json",
            "malformed_other_version.json",
            "malformed_not_json.json",
        )
    }
    error, printed = fails("replay-check", *good, *bad.values())
    assert error == "5 of 7 histories diverged"
    report = "\n".join(printed.splitlines())
    assert f"DIVERGED {bad['order_asked_first.json']}: " in report
    assert "    NondeterminismError: " in report
    assert f"DIVERGED {bad['order_in_euros.json']}: " in report
    assert "    ReplayOutcomeError: " in report
    assert f"INVALID {bad['malformed_wrong_type.json']}: field events[0].seq must be int" in report
    assert "selvedge.history/v2" in report
    assert f"INVALID {bad['malformed_not_json.json']}: history is not JSON" in report

    error, _ = fails("replay-check", str(tmp_path / "missing.json"))
    assert error.startswith(f"cannot read {tmp_path / 'missing.json'}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("replay-check", "--recent", "soon"), "invalid duration 'soon'"),
        (("replay-check", "--limit", "many"), "invalid int value"),
        (("prune",), "--older-than"),
        (("prune", "--older-than", "a while"), "invalid duration 'a while'"),
        (("prune", "--older-than=-1d"), "invalid duration '-1d'"),
        (("prune", "--older-than", "nan"), "invalid duration 'nan'"),
        (
            ("prune", "--older-than", "1d", "--batch-size", "0"),
            "--batch-size must be from 1 to 5000",
        ),
        (
            ("prune", "--older-than", "1d", "--batch-size", "5001"),
            "--batch-size must be from 1 to 5000",
        ),
        (("prune", "--older-than", "1d", "--status", "running"), "invalid choice: 'running'"),
        (("worker", "--max-activities", "0"), "--max-activities must be at least 1"),
        (("worker", "--max-resumptions", "-1"), "--max-resumptions must be at least 1"),
        (("teleport",), "invalid choice: 'teleport'"),
    ],
)
def test_bad_arguments_are_command_errors(tdb: None, args: tuple[str, ...], message: str) -> None:
    error, _ = fails(*args)
    assert message in error


def test_durations() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("45s") == timedelta(seconds=45)
    assert parse_duration(" 3600 ") == timedelta(hours=1)
    assert parse_duration("1.5D") == timedelta(hours=36)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py runselvedge ...`` in a real process (test workflows imported)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    code = (
        "import sys, django; django.setup(); import tests.ops_workflows; "
        "from django.core.management import execute_from_command_line; "
        "execute_from_command_line(['manage.py', 'runselvedge', *sys.argv[1:]])"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_replay_check_exit_status_from_the_command_line(tdb: None) -> None:
    completed = str(HISTORIES / "order_completed.json")
    passed = cli("replay-check", completed)
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.splitlines()[-1] == "checked 1, diverged 0"

    failed = cli(
        "replay-check",
        completed,
        str(HISTORIES / "order_in_euros.json"),
        str(HISTORIES / "malformed_unknown_field.json"),
    )
    assert failed.returncode == 1
    assert "ReplayOutcomeError" in failed.stdout
    assert "unknown field events[1].payload" in failed.stdout
    assert failed.stderr.strip() == "CommandError: 2 of 3 histories diverged"


# -- prune --------------------------------------------------------------------------------


def test_prune_deletes_old_closed_instances_with_everything_they_own(
    clock: ControllableClock, stepper: Worker
) -> None:
    order = {"sku": "tee", "quantity": 3}
    sv.start_workflow("ops.golden.order", order, instance_id="old-order")
    sv.start_workflow(ops_workflows.fail, "no", instance_id="old-failed")
    sv.start_workflow(ops_workflows.wait, instance_id="old-cancelled")
    sv.start_workflow(ops_workflows.wait, instance_id="old-running")
    sv.start_workflow(ops_workflows.echo, 1, instance_id="new-completed")
    run_until_idle(stepper)
    sv.signal("old-order", "approve", {"by": "ada"})
    sv.signal("old-order", "unread", 1)
    sv.signal("old-running", "unread", 1)
    sv.cancel_workflow("old-cancelled")
    run_until_idle(stepper)  # old-order now sleeps: it owns a timer
    assert owned("old-order")["timers"] == 1
    clock.advance(61)
    run_until_idle(stepper)
    (receipt,) = WorkflowInstance.objects.filter(parent_instance_id="old-order")
    closed = ["old-order", receipt.instance_id, "old-failed", "old-cancelled"]
    age(*closed, "old-running")
    assert [sv.describe(i).status for i in closed] == [
        "completed",
        "completed",
        "failed",
        "cancelled",
    ]
    assert owned("old-order") == {"history": 7, "tasks": 1, "signals": 2, "timers": 0}

    printed = run("prune", "--older-than", "30d")
    assert printed.splitlines() == ["deleted 4 so far", "pruned 4 instances"]
    assert not any(exists(i) for i in closed)
    for instance_id in closed:
        assert owned(instance_id) == {"history": 0, "tasks": 0, "signals": 0, "timers": 0}
    assert exists("old-running") and owned("old-running")["signals"] == 1
    assert exists("new-completed")
    assert run("prune", "--older-than", "30d") == "pruned 0 instances\n"
    assert run("prune", "--older-than", "0").splitlines()[-1] == "pruned 1 instances"
    assert list(WorkflowInstance.objects.values_list("instance_id", flat=True)) == ["old-running"]


def test_prune_deletes_timers_of_cancelled_instances(stepper: Worker) -> None:
    sv.start_workflow("ops.golden.order", {"sku": "a", "quantity": 1}, instance_id="timed")
    run_until_idle(stepper)
    sv.signal("timed", "approve", {"by": "ada"})
    run_until_idle(stepper)
    assert owned("timed")["timers"] == 1  # sleeping
    sv.cancel_workflow("timed")
    run_until_idle(stepper)
    assert sv.describe("timed").status == "cancelled"
    age("timed")
    assert run("prune", "--older-than", "1d") == "deleted 1 so far\npruned 1 instances\n"
    assert owned("timed") == {"history": 0, "tasks": 0, "signals": 0, "timers": 0}


def test_prune_keeps_children_of_running_parents(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.parent, instance_id="p-running")
    run_until_idle(stepper)
    (child,) = WorkflowInstance.objects.filter(parent_instance_id="p-running")
    assert child.status == "completed"
    age(child.instance_id, "p-running")
    assert run("prune", "--older-than", "1d") == "pruned 0 instances\n"
    assert exists(child.instance_id)

    sv.signal("p-running", "go", "now")
    run_until_idle(stepper)
    assert sv.get_workflow_result("p-running").output == ["child value", "now"]
    age(child.instance_id, "p-running")
    assert run("prune", "--older-than", "1d").splitlines()[-1] == "pruned 2 instances"
    assert WorkflowInstance.objects.count() == 0


def test_prune_never_deletes_a_running_child_and_it_can_still_close(stepper: Worker) -> None:
    sv.start_workflow(orphaning, instance_id="orphaning")
    run_until_idle(stepper)
    child_id = sv.get_workflow_result("orphaning").output
    assert sv.describe(child_id).status == "running"  # detached from its parent's close
    age("orphaning", child_id)
    assert run("prune", "--older-than", "1d").splitlines()[-1] == "pruned 1 instances"
    assert not exists("orphaning") and exists(child_id)
    sv.signal(child_id, "go", "still fine")
    run_until_idle(stepper)
    assert sv.get_workflow_result(child_id).output == "still fine"


def test_prune_filters_by_status_and_workflow(stepper: Worker) -> None:
    for n in range(2):
        sv.start_workflow(ops_workflows.echo, n, instance_id=f"echo-{n}")
        sv.start_workflow(ops_workflows.fail, "no", instance_id=f"fail-{n}")
    sv.start_workflow(ops_workflows.wait, instance_id="cancelled-0")
    run_until_idle(stepper)
    sv.cancel_workflow("cancelled-0")
    run_until_idle(stepper)
    age("echo-0", "echo-1", "fail-0", "fail-1", "cancelled-0")

    assert run("prune", "--older-than", "1d", "--status", "failed").endswith("pruned 2 instances\n")
    assert not exists("fail-0") and not exists("fail-1") and exists("echo-0")
    assert run("prune", "--older-than", "1d", "--workflow", "ops.ech") == "pruned 0 instances\n"
    assert run("prune", "--older-than", "1d", "--workflow", "ops.wait").endswith(
        "pruned 1 instances\n"
    )
    printed = run("prune", "--older-than", "1d", "--status", "failed", "--status", "completed")
    assert printed.endswith("pruned 2 instances\n")
    assert WorkflowInstance.objects.count() == 0


def test_prune_works_in_bounded_batches_and_shows_progress(stepper: Worker) -> None:
    ids = [f"batch-{n}" for n in range(5)]
    for instance_id in ids:
        sv.start_workflow(ops_workflows.echo, instance_id, instance_id=instance_id)
    run_until_idle(stepper)
    age(*ids)
    with CaptureQueriesContext(connection) as captured:
        printed = run("prune", "--older-than", "1d", "--batch-size", "2")
    assert printed.splitlines() == [
        "deleted 2 so far",
        "deleted 4 so far",
        "deleted 5 so far",
        "pruned 5 instances",
    ]
    deletes = [
        q["sql"]
        for q in captured.captured_queries
        if re.match(r'DELETE FROM "selvedge_django_workflowinstance"', q["sql"])
    ]
    assert len(deletes) == 3
    assert all(len(re.findall(r"'batch-\d'|%s|\?", sql)) <= 2 for sql in deletes)
    assert WorkflowInstance.objects.count() == 0


def test_prune_through_the_operations_layer_validates_its_arguments(tdb: None) -> None:
    from selvedge_django.operations import prune

    with pytest.raises(ValueError, match="closed instances"):
        prune(timedelta(days=1), statuses=["running"])
    with pytest.raises(ValueError, match="non-negative"):
        prune(timedelta(days=-1))
    with pytest.raises(ValueError, match="batch_size"):
        prune(timedelta(days=1), batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        prune(timedelta(days=1), batch_size=5001)
    assert prune(timedelta(0)) == 0


def test_the_worker_commands_stop_signals_wake_its_main_thread_and_are_restored() -> None:
    # Whatever the handlers were before (a shell's background job starts with
    # SIGINT ignored, not with Python's default_int_handler) comes back after.
    before = signal.getsignal(signal.SIGTERM)
    before_int = signal.getsignal(signal.SIGINT)
    with StopSignals() as signals:
        # From another thread while the main thread waits...
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        assert signals.wait() == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    with StopSignals() as signals:
        # ...and before it starts to wait: the signal is not lost.
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.wait() == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before_int


# -- Django's common options --------------------------------------------------------------

COMMON_OPTIONS = [
    (["--settings", "tests.settings"], "settings", "tests.settings"),
    (["--settings=tests.settings"], "settings", "tests.settings"),
    (["--pythonpath", "."], "pythonpath", "."),
    (["--traceback"], "traceback", True),
    (["--no-color"], "no_color", True),
    (["--force-color"], "force_color", True),
    (["-v", "2"], "verbosity", 2),
    (["--verbosity=3"], "verbosity", 3),
    (["--skip-checks"], "skip_checks", True),
]


@pytest.mark.parametrize(("option", "dest", "value"), COMMON_OPTIONS)
@pytest.mark.parametrize(
    "subcommand",
    [["worker", "--queues", "a"], ["describe", "some-id"], ["start", "wf", "{}"], ["prune"]],
)
def test_common_options_work_before_and_after_a_subcommand(
    option: list[str], dest: str, value: Any, subcommand: list[str]
) -> None:
    from selvedge_django.management.commands.runselvedge import Command

    if subcommand == ["prune"]:
        subcommand = ["prune", "--older-than", "30d"]
    parser = Command().create_parser("manage.py", "runselvedge")
    for argv in ([*option, *subcommand], [*subcommand, *option]):
        namespace = parser.parse_args(argv)
        assert getattr(namespace, dest) == value, argv
        assert namespace.subcommand == subcommand[0]
    # Not given: Django's defaults stay.
    defaults = vars(parser.parse_args(subcommand))
    assert defaults["verbosity"] == 1
    assert defaults["settings"] is None
    assert defaults["traceback"] is False
    assert defaults["no_color"] is False


def test_settings_after_a_subcommands_arguments_from_the_command_line(stepper: Worker) -> None:
    instance_id = sv.start_workflow("ops.cmd.orphaning", instance_id="common-options")
    done = cli("describe", instance_id, "--settings=tests.settings", "--traceback", "--no-color")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["instance_id"] == instance_id
    done = cli("describe", "no-such-id", "--settings", "tests.settings", "-v", "0")
    assert done.returncode == 1
    assert "no-such-id" in done.stderr


# -- list, tasks, query, and what start accepts -------------------------------------------


def test_list_prints_one_json_object_per_line(stepper: Worker) -> None:
    for i in range(3):
        sv.start_workflow(ops_workflows.echo, i, instance_id=f"list-echo-{i}")
    sv.start_workflow(ops_workflows.wait, instance_id="list-wait")
    run_until_idle(stepper)

    lines = run("list").splitlines()
    rows = [json.loads(line) for line in lines]
    assert {r["instance_id"] for r in rows} == {
        "list-echo-0",
        "list-echo-1",
        "list-echo-2",
        "list-wait",
    }
    assert set(rows[0]) >= {"instance_id", "workflow_name", "status", "started_at"}

    running = [json.loads(line) for line in run("list", "--status", "running").splitlines()]
    assert [r["instance_id"] for r in running] == ["list-wait"]
    echoes = run("list", "--workflow", "ops.echo", "--limit", "2").splitlines()
    assert len(echoes) == 2 and all(json.loads(e)["workflow_name"] == "ops.echo" for e in echoes)
    assert run("list", "--since", "1h").count("\n") == 4
    WorkflowInstance.objects.update(started_at=timezone.now() - timedelta(days=3))
    assert run("list", "--since", "1d") == ""
    assert "--limit must be" in fails("list", "--limit", "0")[0]
    assert "invalid duration" in fails("list", "--since", "soon")[0]


def test_tasks_prints_the_activity_tasks_as_json(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.order, {"sku": "tee", "quantity": 2}, instance_id="tasks-1")
    run_until_idle(stepper)
    (task,) = json.loads(run("tasks", "tasks-1"))
    assert (task["key"], task["name"], task["status"], task["attempts"]) == (
        "#1:ops.golden.price",
        "ops.golden.price",
        "completed",
        1,
    )
    assert task["options"]["retry_policy"]["max_attempts"] == 5
    assert task["last_error"] is None
    assert "no-such" in fails("tasks", "no-such")[0]


def test_query_prints_the_answer_as_json(stepper: Worker) -> None:
    sv.start_workflow(ops_workflows.order, {"sku": "tee", "quantity": 2}, instance_id="query-1")
    run_until_idle(stepper)
    assert json.loads(run("query", "query-1", "stage")) == "awaiting approval"
    assert "nope" in fails("query", "query-1", "nope")[0]


def test_start_refuses_a_workflow_this_process_does_not_register(tdb: None) -> None:
    error, _ = fails("start", "no.such.workflow", "1")
    assert "not registered" in error and "--allow-unregistered" in error
    assert WorkflowInstance.objects.count() == 0
    out = run("start", "no.such.workflow", "1", "--allow-unregistered", "--id", "elsewhere")
    assert out == "started elsewhere\n"
    assert WorkflowInstance.objects.get().workflow_name == "no.such.workflow"


def test_start_refuses_builtin_workflows_unless_allowed(tdb: None) -> None:
    error, _ = fails("start", "selvedge.prune", '{"older_than": 0}')
    assert "built-in" in error and "--allow-builtin" in error
    error, _ = fails("start", "selvedge.task", '{"task": "os.system"}')
    assert "built-in" in error and "django.tasks" in error
    assert WorkflowInstance.objects.count() == 0
    # An operator with a shell may start the prune workflow on purpose; never a task.
    error, _ = fails("start", "selvedge.task", "{}", "--allow-builtin")
    assert "django.tasks" in error
    out = run("start", "selvedge.prune", '{"older_than": "30d"}', "--allow-builtin", "--id", "p")
    assert out == "started p\n"
    assert WorkflowInstance.objects.get().workflow_name == "selvedge.prune"
