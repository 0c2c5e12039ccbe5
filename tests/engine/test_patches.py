"""Patches in the engine: markers live, the old path in replay, deprecation, parked runs."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django import exceptions as exc
from selvedge_django.engine.context import WorkflowContext
from selvedge_django.engine.events import HistoryRow
from selvedge_django.engine.execution import Execution
from selvedge_django.engine.ports import ExecutionOutcome, ExecutionSnapshot
from tests.engine.test_engine import FENCE, FakeRuntime, completed, double, other


def marker(seq: int, patch_id: str) -> HistoryRow:
    return HistoryRow(
        key=f"#{seq}:patch:{patch_id}",
        seq=seq,
        command="patch",
        event_type="PatchMarker",
        data=json.dumps(patch_id),
    )


def received(seq: int, channel: str, value: Any) -> HistoryRow:
    return HistoryRow(
        key=f"#{seq}:receive:{channel}",
        seq=seq,
        command="receive",
        event_type="SignalReceived",
        data=json.dumps(value),
    )


def run(
    fn: Any,
    history: list[HistoryRow] | None = None,
    *,
    parked: tuple[int, str] = (0, ""),
    readonly: bool = False,
    runtime: FakeRuntime | None = None,
) -> tuple[ExecutionOutcome, Execution, FakeRuntime]:
    runtime = runtime or FakeRuntime()
    snapshot = ExecutionSnapshot(
        instance_id="inst-1",
        workflow_name="engine.wf",
        input=1,
        status="running",
        history=[dataclasses.replace(row) for row in history or []],
        parked_seq=parked[0],
        parked_key=parked[1],
    )
    execution = Execution(runtime, snapshot, None if readonly else FENCE, readonly=readonly)
    outcome = execution.run(fn, WorkflowContext(execution, execution.root_scope))
    return outcome, execution, runtime


def v1(ctx: sv.WorkflowContext, n: int) -> list[Any]:
    a = double.execute(ctx, n)
    return [a, ctx.receive("go")]


def v2(ctx: sv.WorkflowContext, n: int) -> list[Any]:
    a = double.execute(ctx, n)
    if ctx.patched("extra-step"):
        a = other.execute(ctx, a)
    return [a, ctx.receive("go")]


def v3(ctx: sv.WorkflowContext, n: int) -> list[Any]:
    a = double.execute(ctx, n)
    ctx.deprecate_patch("extra-step")
    a = other.execute(ctx, a)
    return [a, ctx.receive("go")]


def bare(ctx: sv.WorkflowContext, n: int) -> list[Any]:
    a = double.execute(ctx, n)
    a = other.execute(ctx, a)
    return [a, ctx.receive("go")]


V1_PARKED = (2, "#2:receive:go")  # v1 suspended at its receive, which records nothing
V1_DONE = [completed(1, "engine_test.double", 2), received(2, "go", "ok")]
V2_DONE = [
    completed(1, "engine_test.double", 2),
    marker(2, "extra-step"),
    completed(3, "engine_test.other", 2),
    received(4, "go", "ok"),
]
V3_DONE = [
    completed(1, "engine_test.double", 2),
    completed(2, "engine_test.other", 2),
    received(3, "go", "ok"),
]


def test_live_patched_records_a_marker_and_takes_the_new_path() -> None:
    outcome, execution, runtime = run(v2, [completed(1, "engine_test.double", 2)])
    assert outcome.kind == "suspended", outcome.error
    assert runtime.store.writes == ["record_command", "reserve_activity"]
    assert runtime.store.rows["#2:patch:extra-step"].data == json.dumps("extra-step")
    assert runtime.store.rows["#2:patch:extra-step"].event_type == "PatchMarker"
    assert "#3:engine_test.other" in runtime.store.rows
    assert execution.patches == {"extra-step": "new"}


def test_a_run_parked_under_v1_takes_the_old_path_under_v2_and_consumes_nothing() -> None:
    outcome, execution, runtime = run(v2, [completed(1, "engine_test.double", 2)], parked=V1_PARKED)
    assert outcome.kind == "suspended", outcome.error
    # No marker and no new activity: the receive keeps position 2, where v1 waited.
    assert runtime.store.writes == []
    assert execution.seq == 2
    assert execution.patches == {"extra-step": "old"}


def test_a_finished_v1_history_replays_under_v2() -> None:
    outcome, execution, runtime = run(v2, V1_DONE)
    assert outcome.kind == "completed", outcome.error
    assert outcome.output == [2, "ok"]
    assert runtime.store.calls == []
    assert execution.patches == {"extra-step": "old"}


def test_a_v2_history_replays_under_v2_with_its_marker() -> None:
    outcome, execution, runtime = run(v2, V2_DONE)
    assert outcome.kind == "completed", outcome.error
    assert runtime.store.calls == []
    assert execution.patches == {"extra-step": "new"}


def test_a_run_parked_before_the_patch_point_takes_the_new_path() -> None:
    # Started under v2, suspended waiting for double (position 1): v2 never reached the
    # patch point, so it is live there.
    outcome, execution, runtime = run(
        v2, [completed(1, "engine_test.double", 2)], parked=(1, "#1:engine_test.double")
    )
    assert outcome.kind == "suspended", outcome.error
    assert runtime.store.writes == ["record_command", "reserve_activity"]
    assert execution.patches == {"extra-step": "new"}


def test_deprecated_code_replays_histories_with_and_without_the_marker() -> None:
    for history in (V2_DONE, V3_DONE):
        outcome, execution, runtime = run(v3, history)
        assert outcome.kind == "completed", outcome.error
        assert outcome.output == [2, "ok"]
        assert runtime.store.calls == []
    # Live, deprecate_patch records nothing: the new activity takes the next position.
    outcome, execution, runtime = run(v3, [completed(1, "engine_test.double", 2)])
    assert runtime.store.writes == ["reserve_activity"]
    assert "#2:engine_test.other" in runtime.store.rows
    assert execution.patches == {"extra-step": "deprecated"}


def test_deprecated_code_refuses_a_history_that_took_the_old_path() -> None:
    # Why a patch is deprecated only once no old-path instance runs: the old path is gone.
    outcome, _, _ = run(v3, V1_DONE)
    assert isinstance(outcome.error, exc.NondeterminismError)


def test_old_code_refuses_a_history_with_the_marker() -> None:
    # Rolling back below a patch that instances have passed is a divergence, not a guess.
    outcome, _, _ = run(v1, V2_DONE)
    assert isinstance(outcome.error, exc.NondeterminismError)


def test_a_bare_insertion_before_a_parked_wait_is_a_divergence() -> None:
    outcome, _, runtime = run(bare, [completed(1, "engine_test.double", 2)], parked=V1_PARKED)
    error = outcome.error
    assert isinstance(error, exc.NondeterminismError), outcome
    assert error.key == "#2:receive:go" and error.actual == "activity"
    assert runtime.store.writes == []  # the new step was not reserved
    # Nor before recorded commands.
    outcome, _, _ = run(bare, V1_DONE)
    assert isinstance(outcome.error, exc.NondeterminismError)


def test_a_patch_id_used_twice_in_one_run_is_a_divergence() -> None:
    def twice(ctx: sv.WorkflowContext, _: Any) -> None:
        ctx.patched("p")
        ctx.deprecate_patch("p")

    outcome, _, runtime = run(twice)
    assert isinstance(outcome.error, exc.NondeterminismError)
    assert "second time" in str(outcome.error)
    assert runtime.store.writes == ["record_command"]


@pytest.mark.parametrize(
    ("patch_id", "error"),
    [("", ValueError), ("x" * 256, ValueError), ("a\x00b", ValueError), (7, TypeError)],
)
def test_bad_patch_ids_raise_and_write_nothing(patch_id: Any, error: type) -> None:
    seen: list[BaseException] = []

    def wf(ctx: sv.WorkflowContext, _: Any) -> None:
        try:
            ctx.patched(patch_id)
        except Exception as raised:
            seen.append(raised)

    outcome, _, runtime = run(wf)
    assert outcome.kind == "completed"
    assert [type(e) for e in seen] == [error]
    assert runtime.store.calls == []


def test_two_patches_at_one_point_each_find_their_marker() -> None:
    def later(ctx: sv.WorkflowContext, n: int) -> list[str]:
        taken = ["b" if ctx.patched("b") else "-"]
        taken.append("a" if ctx.patched("a") else "-")
        return taken

    outcome, _, _ = run(later, [marker(1, "a")])
    assert outcome.output == ["-", "a"]
    outcome, _, runtime = run(later, [])
    assert outcome.output == ["b", "a"]
    assert [r.data for r in runtime.store.rows.values()] == ['"b"', '"a"']


def test_read_only_replay_stops_at_an_unrecorded_marker_and_follows_recorded_ones() -> None:
    outcome, execution, _ = run(v2, V2_DONE[:1], readonly=True)
    assert outcome.kind == "suspended" and execution.patches == {}
    outcome, execution, _ = run(v2, V2_DONE[:1], parked=V1_PARKED, readonly=True)
    assert outcome.kind == "suspended" and execution.patches == {"extra-step": "old"}
    outcome, execution, _ = run(v2, V2_DONE, readonly=True)
    assert outcome.kind == "completed" and execution.patches == {"extra-step": "new"}


def test_patched_is_refused_in_a_query_handler_and_a_predicate() -> None:
    def in_predicate(ctx: sv.WorkflowContext, _: Any) -> None:
        ctx.wait_condition(lambda: ctx.patched("p"))

    outcome, _, _ = run(in_predicate)
    assert isinstance(outcome.error, exc.NondeterminismError)
