"""Looking into the past: ``query(at=)``, ``replay_debug`` and ``runselvedge debug``.

``saga.run`` (``tests/testapp/workflows/sagas.py``) records one activity per step
and answers the query ``done`` with the steps done so far, so the answer at each
history key says how far the code had got there. Each read is checked to leave
every table exactly as it was (no lease, no row), and the debugger's stop is
recorded by a ``sys.breakpointhook`` instead of stopping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.core.management import call_command
from django.db import connection

import selvedge_django as sv
from selvedge_django.testing import replay_debug
from tests.breakpoint_recorder import recorder
from tests.conftest import ROOT


def every_table() -> dict[str, list[dict[str, Any]]]:
    """Every row of every model of selvedge_django and the test app, in key order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for label in ("selvedge_django", "testapp"):
        for model in apps.get_app_config(label).get_models():
            rows[model._meta.label] = list(model.objects.order_by("pk").values())
    return rows


@pytest.fixture
def finished(worker: Any) -> str:
    """A completed three-step instance: ``#1..#3:saga.do``, then the signal at ``#4``."""
    instance_id = sv.start_workflow(
        "saga.run", {"steps": ["a", "b", "c"], "wait": True}, instance_id="steps"
    )
    sv.signal(instance_id, "go", {"by": "test"})
    result = sv.wait_workflow(instance_id, timeout=30)
    assert (result.status, result.output) == ("completed", ["a", "b", "c"])
    worker.stop(timeout=10)  # nothing else may write while tables are compared
    return instance_id


def test_query_at_answers_as_of_each_step_and_writes_nothing(finished: str) -> None:
    before = every_table()

    assert sv.query(finished, "done", at="#1:saga.do") == ["a"]
    assert sv.query(finished, "done", at="#2:saga.do") == ["a", "b"]
    assert sv.query(finished, "done", at=3) == ["a", "b", "c"]
    assert sv.query(finished, "done", at="#4:receive:go") == ["a", "b", "c"]
    assert sv.query(finished, "done", at="$close") == sv.query(finished, "done")
    assert sv.get_handle(finished).query("done", at=2) == ["a", "b"]
    assert async_to_sync(sv.aquery)(finished, "done", at=1) == ["a"]

    assert every_table() == before


def test_query_at_a_key_the_history_does_not_record_is_a_clear_error(finished: str) -> None:
    with pytest.raises(sv.HistoryKeyNotFound) as raised:
        sv.query(finished, "done", at="#9:saga.do")
    assert raised.value.at == "#9:saga.do"
    assert "positions 1 to 4" in str(raised.value)
    assert isinstance(raised.value, LookupError)
    with pytest.raises(sv.HistoryKeyNotFound):
        sv.query(finished, "done", at=5)
    with pytest.raises(TypeError):
        sv.query(finished, "done", at=True)  # type: ignore[arg-type]


def test_query_at_sees_signals_as_delivered_then(worker: Any, redefine: Any) -> None:
    def inbox(ctx: sv.WorkflowContext, data: Any) -> list[Any]:
        got: list[Any] = []
        ctx.set_query_handler("state", lambda: {"got": list(got), "pending": ctx.pending("in")})
        for _ in range(2):
            got.append(ctx.receive("in"))
        return got

    redefine("state.inbox", inbox)
    instance_id = sv.start_workflow("state.inbox", None, instance_id="inbox")
    sv.signal(instance_id, "in", 1)
    sv.signal(instance_id, "in", 2)
    assert sv.wait_workflow(instance_id, timeout=30).output == [1, 2]

    assert sv.query(instance_id, "state", at=1)["got"] == [1]
    assert sv.query(instance_id, "state", at=2)["got"] == [1, 2]
    assert sv.query(instance_id, "state")["got"] == [1, 2]


def test_replay_debug_stops_once_before_the_command_and_writes_nothing(
    finished: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sys, "breakpointhook", recorder(calls))
    before = every_table()

    result = replay_debug(finished, stop_at="#2:saga.do")

    assert every_table() == before
    assert len(calls) == 1
    stop = calls[0]
    assert (stop["seq"], stop["key"], stop["command"], stop["recorded"]) == (
        2,
        "#2:saga.do",
        "activity",
        "#2:saga.do",
    )
    # Up the stack, the workflow's own frame, just before it issues step b.
    assert stop["function"] == "saga_run"
    assert stop["locals"]["done"] == ["a"]
    assert stop["locals"]["tag"] == "b"
    assert (result.stopped, result.outcome, result.output) == (True, "completed", ["a", "b", "c"])
    assert result.query_handlers == ["done"]


def test_replay_debug_without_stop_at_runs_through_and_refuses_unknown_keys(
    finished: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sys, "breakpointhook", recorder(calls))

    result = replay_debug(finished)
    assert (result.stopped, result.outcome, calls) == (False, "completed", [])
    with pytest.raises(sv.HistoryKeyNotFound):
        replay_debug(finished, stop_at="#7:saga.do")
    with pytest.raises(sv.HistoryKeyNotFound, match="close record"):
        replay_debug(finished, stop_at="$close")
    assert calls == []


def test_replay_debug_of_an_exported_file_needs_no_database(
    finished: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any
) -> None:
    path = tmp_path / "steps.json"
    path.write_text(sv.export_history(finished).to_json(), encoding="utf-8")
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sys, "breakpointhook", recorder(calls))

    with django_db_blocker.block():  # any database access now fails the test
        result = replay_debug(path, stop_at=3)
        text_result = replay_debug(path.read_text(encoding="utf-8"))

    assert [(c["key"], c["locals"]["done"]) for c in calls] == [("#3:saga.do", ["a", "b"])]
    assert result.output == text_result.output == ["a", "b", "c"]


def test_replay_debug_of_a_running_instance_ends_at_its_frontier(
    worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance_id = sv.start_workflow("saga.run", {"steps": ["a"], "wait": True})
    from tests.conftest import wait_until

    wait_until(lambda: sv.query(instance_id, "done") == ["a"])
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sys, "breakpointhook", recorder(calls))

    result = replay_debug(instance_id, stop_at="#1:saga.do")

    assert result.outcome == "suspended"
    assert result.last_key == "#2:receive:go"
    assert [c["locals"]["done"] for c in calls] == [[]]


def subprocess_env(log: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "SELVEDGE_TEST_SUBPROCESS": "1",
        "PYTHONPATH": str(ROOT),
        "PYTHONBREAKPOINT": "tests.breakpoint_recorder.record",
        "SELVEDGE_BREAKPOINT_LOG": str(log),
    }
    if connection.vendor == "postgresql":
        env["SELVEDGE_PG_TEST_NAME"] = str(connection.settings_dict["NAME"])
    return env


@pytest.mark.parametrize("source", ["instance", "file"])
def test_the_debug_command_exits_0_under_a_recording_breakpoint_hook(
    finished: str, tmp_path: Path, source: str
) -> None:
    log = tmp_path / "stops.jsonl"
    target = [finished]
    if source == "file":
        path = tmp_path / "steps.json"
        path.write_text(sv.export_history(finished).to_json(), encoding="utf-8")
        target = ["--file", str(path)]
    before = every_table()

    done = subprocess.run(
        [sys.executable, "-m", "django", "runselvedge", "debug", *target, "--stop-at", "2"],
        cwd=str(ROOT),
        env=subprocess_env(log),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["stopped"], report["outcome"], report["output"]) == (
        True,
        "completed",
        ["a", "b", "c"],
    )
    stops = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [(s["key"], s["function"], s["locals"]["done"]) for s in stops] == [
        ("#2:saga.do", "saga_run", ["a"])
    ]
    assert "your workflow code is" in done.stderr
    assert every_table() == before


def test_the_debug_command_refuses_an_unknown_key(finished: str) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="records no command at"):
        call_command("runselvedge", "debug", finished, "--stop-at", "#8:nothing")
    with pytest.raises(CommandError, match="not both"):
        call_command("runselvedge", "debug")


def test_the_query_command_answers_at_a_step(finished: str, capsys: Any) -> None:
    call_command("runselvedge", "query", finished, "done", "--at", "#2:saga.do")
    assert json.loads(capsys.readouterr().out) == ["a", "b"]
