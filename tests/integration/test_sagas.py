"""Sagas on real databases: compensations run in reverse, durably, after errors and cancels.

A real worker thread runs ``saga.run`` (``tests/testapp/workflows/sagas.py``); the
ledger shows which steps and which compensation attempts ran, and the history shows
that each compensation is an activity recorded like any other.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent
from selvedge_django.testing import replay_debug
from tests.breakpoint_recorder import recorder
from tests.conftest import wait_until
from tests.testapp.models import Ledger


def ledger() -> list[str]:
    return list(Ledger.objects.order_by("id").values_list("entry", flat=True))


def undo_keys(instance_id: str) -> list[str]:
    """The history keys of the compensations, in command order."""
    rows = HistoryEvent.objects.filter(instance_id=instance_id, command="activity").order_by("seq")
    return [row.key for row in rows if row.key.endswith(":saga.undo")]


def run(data: dict[str, Any], instance_id: str) -> sv.WorkflowResult:
    sv.start_workflow("saga.run", data, instance_id=instance_id)
    return sv.wait_workflow(instance_id, timeout=30)


def test_a_failed_block_runs_the_compensations_in_reverse_then_raises_its_error(
    worker: Any,
) -> None:
    result = run({"steps": ["a", "b", "c"], "fail": True}, "saga-reverse")

    assert result.status == "failed"
    assert isinstance(result.error, sv.ApplicationError)
    assert (result.error.type, result.error.message) == ("OrderFailed", "the order failed")
    assert ledger() == [
        "do:a",
        "do:b",
        "do:c",
        "undo:c:1",
        "undone:c",
        "undo:b:1",
        "undone:b",
        "undo:a:1",
        "undone:a",
    ]
    assert undo_keys("saga-reverse") == ["#4:saga.undo", "#5:saga.undo", "#6:saga.undo"]
    sv.replay_instance("saga-reverse")  # the recorded compensations replay


def test_a_block_that_completes_runs_no_compensation(worker: Any) -> None:
    result = run({"steps": ["a", "b"]}, "saga-ok")

    assert (result.status, result.output) == ("completed", ["a", "b"])
    assert ledger() == ["do:a", "do:b"]
    assert undo_keys("saga-ok") == []


def test_each_compensation_has_its_own_retries(worker: Any) -> None:
    data = {"steps": ["a", "b"], "fail": True, "undo": {"b": {"fail_until": 3}}}
    result = run(data, "saga-retries")

    assert result.status == "failed"
    assert result.error.type == "OrderFailed"
    assert ledger()[2:] == ["undo:b:1", "undo:b:2", "undo:b:3", "undone:b", "undo:a:1", "undone:a"]


def test_a_compensation_that_fails_for_good_stops_the_rest_and_carries_both_errors(
    worker: Any,
) -> None:
    data = {"steps": ["a", "b", "c"], "fail": True, "undo": {"b": {"final": True}}}
    result = run(data, "saga-broken")

    assert result.status == "failed"
    error = result.error
    assert isinstance(error, sv.CompensationError)
    assert isinstance(error.error, sv.ApplicationError) and error.error.type == "OrderFailed"
    assert isinstance(error.compensation_error, sv.ApplicationError)
    assert error.compensation_error.type == "UndoRefused"
    assert len(error.compensation_errors) == 1
    # c was undone, b refused for good (non-retryable: one attempt), a was not tried.
    assert ledger()[3:] == ["undo:c:1", "undone:c", "undo:b:1"]
    sv.replay_instance("saga-broken")


def test_continue_on_error_runs_every_compensation_and_reports_each_failure(
    worker: Any,
) -> None:
    data = {
        "steps": ["a", "b", "c"],
        "fail": True,
        "continue_on_error": True,
        "undo": {"b": {"final": True}, "a": {"fail_until": 9}},
    }
    result = run(data, "saga-continue")

    error = result.error
    assert isinstance(error, sv.CompensationError)
    assert error.error.type == "OrderFailed"
    assert [type(e).__name__ for e in error.compensation_errors] == [
        "ApplicationError",
        "RetryExhaustedError",
    ]
    assert error.compensation_errors[0].type == "UndoRefused"
    assert ledger()[3:] == [
        "undo:c:1",
        "undone:c",
        "undo:b:1",
        "undo:a:1",
        "undo:a:2",
        "undo:a:3",
    ]


def test_parallel_compensations_run_at_once(worker: Any, tmp_path: Path) -> None:
    # Every compensation holds until the marker goes; the marker goes only once all three
    # have started, which one at a time could never reach.
    marker = tmp_path / "hold"
    marker.touch()
    hold = {"hold_while": str(marker)}
    data = {
        "steps": ["a", "b", "c"],
        "fail": True,
        "parallel": True,
        "undo": {"a": hold, "b": hold, "c": hold},
    }
    instance_id = sv.start_workflow("saga.run", data, instance_id="saga-parallel")
    wait_until(lambda: {"undo:a:1", "undo:b:1", "undo:c:1"} <= set(ledger()))
    assert not [e for e in ledger() if e.startswith("undone:")]
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=30)

    assert result.status == "failed" and result.error.type == "OrderFailed"
    assert sorted(e for e in ledger() if e.startswith("undone:")) == [
        "undone:a",
        "undone:b",
        "undone:c",
    ]
    # Reserved in reverse order of addition, before any of them was waited for.
    tasks = ActivityTask.objects.filter(instance_id=instance_id, name="saga.undo").order_by("seq")
    assert [json.loads(t.input)["tag"] for t in tasks] == ["c", "b", "a"]
    sv.replay_instance(instance_id)


def test_a_cancelled_workflow_runs_its_compensations_then_closes_cancelled(worker: Any) -> None:
    instance_id = sv.start_workflow(
        "saga.run", {"steps": ["a", "b"], "wait": True}, instance_id="saga-cancel"
    )
    wait_until(lambda: "do:b" in ledger())
    sv.cancel_workflow(instance_id, reason="customer changed their mind")
    result = sv.wait_workflow(instance_id, timeout=30)

    assert result.status == "cancelled"
    assert isinstance(result.error, sv.WorkflowCancelled)
    assert ledger() == ["do:a", "do:b", "undo:b:1", "undone:b", "undo:a:1", "undone:a"]
    sv.replay_instance(instance_id)


def test_add_compensation_refuses_bad_input_and_use_outside_the_block(
    worker: Any, redefine: Any
) -> None:
    seen: list[str] = []

    def misuse(ctx: sv.WorkflowContext, data: Any) -> list[str]:
        from tests.testapp.workflows.sagas import undo

        saga = ctx.saga()
        try:
            saga.add_compensation(undo, {"tag": "x"})
        except RuntimeError as error:
            seen.append(f"outside: {error}")
        with saga:
            try:
                saga.add_compensation(undo, {"tag": {1, 2}})
            except TypeError as error:
                seen.append(f"input: {error}")
            try:
                saga.add_compensation(lambda x: x, 1)
            except TypeError as error:
                seen.append(f"activity: {error}")
        return seen

    redefine("saga.misuse", misuse)
    instance_id = sv.start_workflow("saga.misuse", None)
    result = sv.wait_workflow(instance_id, timeout=30)

    assert result.status == "completed"
    assert [line.split(":")[0] for line in result.output] == ["outside", "input", "activity"]
    assert "not JSON" in result.output[1]
    assert undo_keys(instance_id) == []


@pytest.mark.parametrize("continue_on_error", [False, True])
def test_compensation_error_survives_storage(continue_on_error: bool) -> None:
    from selvedge_django.engine.codec import error_from_envelope, error_to_envelope

    original = sv.ApplicationError("boom", type="OrderFailed", details={"id": 3})
    failures = [sv.ApplicationError("no", type="UndoRefused"), RuntimeError("later")]
    error = sv.CompensationError(original, failures if continue_on_error else failures[:1])
    rebuilt = error_from_envelope(error_to_envelope(error))

    assert isinstance(rebuilt, sv.CompensationError)
    assert rebuilt.message == error.message
    assert rebuilt.error.type == "OrderFailed" and rebuilt.error.details == {"id": 3}
    assert [getattr(e, "type", None) for e in rebuilt.compensation_errors] == (
        ["UndoRefused", "RuntimeError"] if continue_on_error else ["UndoRefused"]
    )


def test_a_cancel_request_during_the_compensations_does_not_stop_them(
    worker: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "hold"
    marker.touch()
    data = {"steps": ["a", "b"], "fail": True, "undo": {"b": {"hold_while": str(marker)}}}
    instance_id = sv.start_workflow("saga.run", data, instance_id="saga-cancel-late")
    wait_until(lambda: "undo:b:1" in ledger())
    sv.cancel_workflow(instance_id, reason="too late to stop the undoing")
    wait_until(lambda: sv.describe(instance_id).cancel_requested)
    marker.unlink()
    result = sv.wait_workflow(instance_id, timeout=30)

    # The compensations ran on a detached context: the request reached none of them,
    # and the block's own error closes the run.
    assert result.status == "failed" and result.error.type == "OrderFailed"
    assert ledger() == ["do:a", "do:b", "undo:b:1", "undone:b", "undo:a:1", "undone:a"]


# -- a golden history: what today's code records for a saga must keep replaying ---------------

GOLDEN = Path(__file__).resolve().parents[1] / "histories" / "saga_compensated.json"
GOLDEN_INPUT = {"steps": ["a", "b", "c"], "fail": True, "undo": {"b": {"fail_until": 2}}}


def blank_tracebacks(value: Any) -> Any:
    """The document without tracebacks: they name the files of the machine that recorded it."""
    if isinstance(value, dict):
        return {k: "" if k == "traceback" else blank_tracebacks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [blank_tracebacks(item) for item in value]
    return value


@pytest.mark.skipif(os.environ.get("SELVEDGE_WRITE_GOLDEN") != "1", reason="records goldens")
def test_record_the_golden_saga_history(worker: Any) -> None:
    result = run(GOLDEN_INPUT, "golden-saga")
    assert result.status == "failed"
    doc = blank_tracebacks(json.loads(sv.export_history("golden-saga").to_json()))
    GOLDEN.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def test_the_golden_saga_history_replays_and_debugs_without_a_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No database fixture: pytest-django refuses any database access in this test.
    history = sv.parse_history(GOLDEN.read_bytes())
    assert [e.key for e in history.events if e.key.endswith("saga.undo")] == [
        "#4:saga.undo",
        "#5:saga.undo",
        "#6:saga.undo",
    ]
    sv.replay_history(history)

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sys, "breakpointhook", recorder(calls))
    debug = replay_debug(GOLDEN, stop_at="#5:saga.undo")

    # The compensation is issued by the saga as the block unwinds: the first frame of the
    # workflow's own code up the stack is its `with` statement, the error on its way out.
    assert [(c["key"], c["function"], c["locals"]["done"]) for c in calls] == [
        ("#5:saga.undo", "saga_run", ["a", "b", "c"])
    ]
    assert debug.stopped and debug.outcome == "failed"
    assert isinstance(debug.error, sv.ApplicationError) and debug.error.type == "OrderFailed"
