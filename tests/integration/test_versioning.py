"""Changing workflow code under running instances: a patch's lifecycle on a real database.

v1 is the code before the change, v2 adds a step behind ``ctx.patched``, v3
deprecates the patch (only the new path is left), and ``bare`` is the same
insertion without a patch, which the deploy gate must refuse.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.conf import resolve_settings
from selvedge_django.models import HistoryEvent, WorkflowInstance
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker

NAME = "versioning.order"
CHECKS: list[int] = []


@sv.activity(name="versioning.price")
def price(n: int) -> int:
    return n * 10


@sv.activity(name="versioning.fraud_check")
def fraud_check(n: int) -> int:
    CHECKS.append(n)
    return n


def v1(ctx: sv.WorkflowContext, n: int) -> dict[str, Any]:
    total = price.execute(ctx, n)
    return {"total": total, "approved": ctx.receive("approve")}


def v2(ctx: sv.WorkflowContext, n: int) -> dict[str, Any]:
    total = price.execute(ctx, n)
    if ctx.patched("fraud-check"):
        fraud_check.execute(ctx, total)
    return {"total": total, "approved": ctx.receive("approve")}


def v3(ctx: sv.WorkflowContext, n: int) -> dict[str, Any]:
    total = price.execute(ctx, n)
    ctx.deprecate_patch("fraud-check")
    fraud_check.execute(ctx, total)
    return {"total": total, "approved": ctx.receive("approve")}


def bare(ctx: sv.WorkflowContext, n: int) -> dict[str, Any]:
    total = price.execute(ctx, n)
    fraud_check.execute(ctx, total)
    return {"total": total, "approved": ctx.receive("approve")}


sv.workflow(name=NAME)(v1)

Define = Callable[[str, Callable[..., Any]], None]


def markers(instance_id: str) -> list[str | None]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id, command="patch").values_list(
            "data", flat=True
        )
    )


def replay_check(*args: str) -> tuple[str, CommandError | None]:
    out = StringIO()
    try:
        call_command("runselvedge", "replay-check", "--recent", "0", *args, stdout=out)
    except CommandError as error:
        return out.getvalue(), error
    return out.getvalue(), None


def finish(worker: Worker, instance_id: str) -> sv.WorkflowResult:
    sv.signal(instance_id, "approve", "ada")
    run_until_idle(worker)
    return sv.get_workflow_result(instance_id)


@pytest.fixture(autouse=True)
def _reset() -> None:
    CHECKS.clear()


def test_a_patch_from_introduction_to_deprecation(tdb: None, redefine: Define) -> None:
    worker = Worker()
    redefine(NAME, v1)
    sv.start_workflow(NAME, 1, instance_id="old")
    run_until_idle(worker)
    parked = WorkflowInstance.objects.get(instance_id="old")
    assert (parked.parked_seq, parked.parked_key) == (2, "#2:receive:approve")

    # v2: the instance blocked under v1 replays, reports the old path, and completes on
    # it without running the new step.
    redefine(NAME, v2)
    assert sv.replay_instance("old").patches == {"fraud-check": "old"}
    out, error = replay_check()
    assert error is None, out
    assert "ok old patches: fraud-check=old" in out
    result = finish(worker, "old")
    assert result.status == "completed", result.error
    assert result.output == {"total": 10, "approved": "ada"}
    assert CHECKS == [] and markers("old") == []
    assert sv.replay_instance("old").patches == {"fraud-check": "old"}

    # A new instance under v2 records the marker and runs the new step.
    sv.start_workflow(NAME, 2, instance_id="new")
    run_until_idle(worker)
    assert CHECKS == [20] and markers("new") == ['"fraud-check"']
    assert "ok new patches: fraud-check=new" in replay_check()[0]
    assert finish(worker, "new").status == "completed"
    assert sv.replay_instance("new").patches == {"fraud-check": "new"}

    # v3 (deprecated): histories with the marker and without it (v3's own) both replay.
    redefine(NAME, v3)
    assert sv.replay_instance("new").patches == {"fraud-check": "new"}
    sv.start_workflow(NAME, 3, instance_id="newer")
    run_until_idle(worker)
    assert CHECKS == [20, 30] and markers("newer") == []
    assert finish(worker, "newer").output == {"total": 30, "approved": "ada"}
    assert sv.replay_instance("newer").patches == {"fraud-check": "deprecated"}
    # The old path is gone: why a patch is deprecated only once no old-path run is left.
    with pytest.raises(sv.ReplayError):
        sv.replay_instance("old")


def test_a_bare_insertion_is_refused_by_replay_check(tdb: None, redefine: Define) -> None:
    worker = Worker()
    redefine(NAME, v1)
    sv.start_workflow(NAME, 1, instance_id="blocked")
    run_until_idle(worker)

    redefine(NAME, bare)
    out, error = replay_check()
    assert error is not None, out
    assert "DIVERGED blocked" in out and "checked 1, diverged 1" in out
    # Deployed anyway, the worker fails the instance instead of running the new step.
    run_until_idle(worker)
    sv.signal("blocked", "approve", "ada")
    run_until_idle(worker)
    result = sv.get_workflow_result("blocked")
    assert result.status == "failed" and isinstance(result.error, sv.NondeterminismError)
    assert CHECKS == []


# -- code versions ----------------------------------------------------------------------


def start_under(version: str | None, instance_id: str) -> None:
    with override_settings(SELVEDGE={"CODE_VERSION": version}):
        sv.start_workflow(NAME, 1, instance_id=instance_id)
    assert sv.describe(instance_id).code_version == version


def test_version_pinned_workers_leave_other_versions_alone(tdb: None, redefine: Define) -> None:
    redefine(NAME, v1)
    start_under("v1", "blue")
    start_under("v2", "green")
    start_under(None, "plain")
    green_only = Worker(compatible_versions=["v2"])
    run_until_idle(green_only)
    assert WorkflowInstance.objects.get(instance_id="green").parked_seq == 2
    assert WorkflowInstance.objects.get(instance_id="blue").parked_seq == 0
    assert WorkflowInstance.objects.get(instance_id="plain").parked_seq == 0
    # A signal wakes the instance; a worker of another version still does not take it.
    sv.signal("blue", "approve", "ada")
    run_until_idle(green_only)
    assert sv.describe("blue").status == "running"
    assert WorkflowInstance.objects.get(instance_id="blue").runnable
    blue_and_plain = Worker(compatible_versions=["v1", None])
    run_until_idle(blue_and_plain)
    assert sv.get_workflow_result("blue").output == {"total": 10, "approved": "ada"}
    assert WorkflowInstance.objects.get(instance_id="plain").parked_seq == 2
    assert sv.describe("green").status == "running"
    nothing = Worker(compatible_versions=[])
    sv.signal("green", "approve", "bob")
    run_until_idle(nothing)
    assert sv.describe("green").status == "running"
    run_until_idle(green_only)
    assert sv.describe("green").status == "completed"


def test_the_version_is_recorded_once_at_the_start(tdb: None, redefine: Define) -> None:
    redefine(NAME, v1)
    start_under("v7", "solo")
    run_until_idle(Worker(code_version="v8"))
    assert sv.describe("solo").code_version == "v7"


@pytest.mark.parametrize(
    "settings",
    [
        {"CODE_VERSION": ""},
        {"CODE_VERSION": 3},
        {"COMPATIBLE_VERSIONS": "v1"},
        {"COMPATIBLE_VERSIONS": ["v1", 2]},
        {"COMPATIBLE_VERSIONS": ["x"] * 101},
    ],
)
def test_bad_version_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ImproperlyConfigured):
        resolve_settings(settings)


def test_versions_command_counts_running_instances_per_version_and_patch(
    tdb: None, redefine: Define
) -> None:
    redefine(NAME, v1)
    start_under("v1", "a")
    start_under("v1", "b")
    worker = Worker()
    run_until_idle(worker)
    redefine(NAME, v2)
    start_under("v2", "c")
    start_under(None, "d")
    run_until_idle(worker)
    assert markers("c") == ['"fraud-check"'] and markers("d") == ['"fraud-check"']
    finish(worker, "d")  # closed: counted nowhere
    out = StringIO()
    call_command("runselvedge", "versions", stdout=out)
    assert out.getvalue().splitlines() == [
        f"{NAME}: 3 running",
        "  code version v1: 2",
        "  code version v2: 1",
        "  patch fraud-check: 1 with its marker, 2 without",
    ]
    out = StringIO()
    call_command("runselvedge", "versions", "--json", "--workflow", NAME, stdout=out)
    assert json.loads(out.getvalue()) == {
        "workflow_name": NAME,
        "running": 3,
        "versions": [{"code_version": "v1", "running": 2}, {"code_version": "v2", "running": 1}],
        "patches": [{"patch_id": "fraud-check", "with_marker": 1, "without_marker": 2}],
    }
    out = StringIO()
    call_command("runselvedge", "versions", "--workflow", "nothing.here", stdout=out)
    assert out.getvalue() == ""


def test_a_code_version_its_own_workers_do_not_lease_is_a_warning() -> None:
    from django.core.checks import run_checks

    def warned() -> bool:
        return any(m.id == "selvedge.W005" for m in run_checks(tags=["selvedge"]))

    with override_settings(SELVEDGE={"CODE_VERSION": "v3", "COMPATIBLE_VERSIONS": ["v2"]}):
        assert warned()
    with override_settings(SELVEDGE={"CODE_VERSION": "v3", "COMPATIBLE_VERSIONS": ["v2", "v3"]}):
        assert not warned()
    with override_settings(SELVEDGE={"COMPATIBLE_VERSIONS": [None]}):
        assert not warned()
