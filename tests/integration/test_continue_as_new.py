"""ctx.continue_as_new(input): a generation ends and a fresh history starts (SPEC section 11).

One fenced transaction archives the generation's rows as a resume archives them
(with a close record holding the next input), keeps the signals it did not
consume for the next generation, and makes the instance runnable under the same
id with the new input, the next generation and a new lease epoch. Default child
ids of a later history name its generation, and a child's outcome reaches only
the history that started it. Every statement of the transaction is failed in
turn: each failure leaves everything as it was.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    SignalMessage,
    WorkflowInstance,
)
from selvedge_django.operations import client_store
from selvedge_django.testing import FaultInjector, InjectedFault, run_until_idle
from selvedge_django.worker import Worker
from tests.testapp.workflows import continuation

QUIET = {"run_local_starts": False}


def drive(instance_id: str, *, timeout: float = 30.0) -> str:
    """Run an inline worker until nothing is runnable; return the instance's status."""
    deadline = time.monotonic() + timeout
    worker = Worker(**QUIET)
    while True:
        run_until_idle(worker)
        inst = WorkflowInstance.objects.get(instance_id=instance_id)
        if inst.status != "running" or not inst.runnable:
            return inst.status
        assert time.monotonic() < deadline, f"{instance_id} still runnable"


def archived(instance_id: str) -> list[tuple[int, str, str]]:
    return list(
        ArchivedHistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("generation", "event_id")
        .values_list("generation", "key", "event_type")
    )


def keys(instance_id: str) -> list[str]:
    return list(
        HistoryEvent.objects.filter(instance_id=instance_id)
        .order_by("id")
        .values_list("key", flat=True)
    )


def test_a_generation_is_archived_and_the_next_runs_with_the_new_input(tdb: None) -> None:
    continuation.RUNS.clear()
    iid = sv.start_workflow("can.count", {"total": 0, "batch": 2}, instance_id="counter")
    for value in (1, 2, 3):
        sv.signal(iid, "add", value)
    assert drive(iid) == "running"

    description = sv.describe(iid)
    assert (description.status, description.generation) == ("running", 2)
    inst = WorkflowInstance.objects.get(instance_id=iid)
    assert inst.input == {"total": 3, "batch": 2, "generations": 2}
    assert (inst.history_generation, inst.lease_owner) == (2, "")
    # Generation 1: two receives, the activity, and the close holding the next input.
    gen1 = archived(iid)
    assert [(g, e) for g, _, e in gen1] == [
        (1, "SignalReceived"),
        (1, "SignalReceived"),
        (1, "ActivityCompleted"),
        (1, "WorkflowContinuedAsNew"),
    ]
    close = ArchivedHistoryEvent.objects.get(instance_id=iid, key="$close")
    assert json.loads(close.data or "") == inst.input
    note_key = gen1[2][1]
    summary = json.loads(
        ArchivedHistoryEvent.objects.get(instance_id=iid, key=note_key).task or "{}"
    )
    assert (summary["name"], summary["status"], summary["attempts"]) == ("can.note", "completed", 1)
    # The current history is generation 2's: the third signal, carried over, received.
    assert len(keys(iid)) == 1
    signals = list(
        SignalMessage.objects.filter(instance_id=iid)
        .order_by("id")
        .values_list("payload", "archived_generation", "consumed_seq")
    )
    assert signals == [("1", 1, 1), ("2", 1, 2), ("3", None, 1)]

    sv.signal(iid, "add", 4)
    sv.signal(iid, "add", "stop")
    assert drive(iid) == "completed"
    result = sv.get_workflow_result(iid)
    assert result.output == {"total": 10, "generations": 3}
    assert sv.describe(iid).generation == 3
    assert continuation.RUNS["note"] == 2
    # Each generation reserved the activity under the same key: its task is generation 3's
    # to hold no more (archived with its summary), and none is left behind.
    assert not ActivityTask.objects.filter(instance_id=iid).exists()
    assert [g for g, key, _ in archived(iid) if key == note_key] == [1, 2]


def test_the_export_shows_archived_generations_and_replay_checks_the_current(
    tdb: None,
) -> None:
    iid = sv.start_workflow("can.count", {"total": 0, "batch": 1}, instance_id="exported")
    sv.signal(iid, "add", 5)
    sv.signal(iid, "add", 6)
    assert drive(iid) == "running"
    assert sv.describe(iid).generation == 3
    history = sv.export_history(iid)
    document = json.loads(history.to_json())
    assert document["instance"]["input"] == {"total": 11, "batch": 1, "generations": 3}
    assert document["instance"]["history_generation"] == 3
    assert sorted({a["generation"] for a in document["archived"]}) == [1, 2]
    assert [a["event_type"] for a in document["archived"] if a["key"] == "$close"] == [
        "WorkflowContinuedAsNew",
        "WorkflowContinuedAsNew",
    ]
    # The signals the archived generations consumed are not the current history's.
    assert document["signals"] == []
    assert document["events"] == []
    parsed = sv.parse_history(history.to_json())
    assert parsed.to_dict() == document
    sv.replay_history(parsed)
    sv.replay_instance(iid)
    out = io.StringIO()
    call_command("runselvedge", "replay-check", stdout=out)
    assert iid in out.getvalue()
    sv.signal(iid, "add", "stop")
    assert drive(iid) == "completed"
    sv.replay_instance(iid)
    assert sv.get_workflow_result(iid).output == {"total": 11, "generations": 3}


def test_default_child_ids_name_the_generation_and_never_collide(tdb: None) -> None:
    iid = sv.start_workflow("can.children", 1, instance_id="family")
    assert drive(iid) == "completed"
    child_id, value = sv.get_workflow_result(iid).output
    # Generation 1 keeps the ids it always had; generation 2's name it.
    children = dict(
        WorkflowInstance.objects.filter(parent_instance_id=iid).values_list(
            "instance_id", "parent_generation"
        )
    )
    key = next(key for _, key, e in archived(iid) if e == "ChildCompleted")
    assert children == {f"{iid}/{key}": 1, f"{iid}/gen-2/{key}": 2}
    assert (child_id, value) == (f"{iid}/gen-2/{key}", "round 2")
    assert sv.get_workflow_result(f"{iid}/{key}").output == "round 1"


def test_an_earlier_generations_child_never_reaches_the_next_history(tdb: None) -> None:
    """The stale-parent race: a child of generation 1 closes while generation 2 waits on
    a child under the same history key. Its outcome stays in its own record."""
    iid = sv.start_workflow("can.stale_parent", 1, instance_id="stale")
    assert drive(iid) == "running"
    gen1_key = next(key for _, key, e in archived(iid) if e != "WorkflowContinuedAsNew")
    old, new = f"{iid}/{gen1_key}", f"{iid}/gen-2/{gen1_key}"
    assert keys(iid) == [gen1_key]  # generation 2 waits on its own child, same key
    assert WorkflowInstance.objects.get(instance_id=old).cancel_requested
    sv.signal(old, "go", "late")
    assert drive(iid) == "running"
    assert sv.get_workflow_result(old).output == "gen1:late"
    row = HistoryEvent.objects.get(instance_id=iid, key=gen1_key)
    assert row.data is None  # not generation 2's outcome
    # The archived row is kept as it was (no value: the generation ended without it).
    assert (
        ArchivedHistoryEvent.objects.get(instance_id=iid, generation=1, key=gen1_key).data is None
    )
    sv.signal(new, "go", "on time")
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == "gen2:on time"
    sv.replay_instance(iid)


def test_a_child_that_closed_before_the_continue_is_archived_with_its_outcome(
    tdb: None,
) -> None:
    iid = sv.start_workflow("can.stale_parent", 0, instance_id="early")
    assert drive(iid) == "running"
    [child_key] = [k for k in keys(iid) if "child" in k]
    sv.signal(f"{iid}/{child_key}", "go", "early")
    assert drive(iid) == "running"
    sv.signal(iid, "next", None)
    assert drive(iid) == "running"
    row = ArchivedHistoryEvent.objects.get(instance_id=iid, generation=1, key=child_key)
    assert (row.event_type, json.loads(row.data or "")) == ("ChildCompleted", "gen1:early")
    sv.signal(f"{iid}/gen-2/{child_key}", "go", "later")
    assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == "gen2:later"


def test_an_unstorable_input_is_rejected_in_the_code_and_swallowing_it_fails(
    tdb: None,
) -> None:
    rejected = sv.start_workflow("can.misuse", "unencodable", instance_id="m-1")
    swallowed = sv.start_workflow("can.misuse", "swallow", instance_id="m-2")
    assert drive(rejected) == "completed"
    assert sv.get_workflow_result(rejected).output == "rejected: WorkflowStartRejected"
    assert sv.describe(rejected).generation == 1
    assert drive(swallowed) == "failed"
    error = sv.get_workflow_result(swallowed).error
    assert isinstance(error, sv.NondeterminismError)
    assert (sv.describe(swallowed).generation, archived(swallowed)) == (1, [])


def state(instance_id: str) -> dict[str, Any]:
    inst = WorkflowInstance.objects.filter(instance_id=instance_id).values().get()
    inst.pop("updated_at")
    return {
        "instance": inst,
        "history": list(HistoryEvent.objects.filter(instance_id=instance_id).values()),
        "archive": list(ArchivedHistoryEvent.objects.filter(instance_id=instance_id).values()),
        "tasks": list(ActivityTask.objects.filter(instance_id=instance_id).values()),
        "signals": list(SignalMessage.objects.filter(instance_id=instance_id).values()),
        "children": list(WorkflowInstance.objects.filter(parent_instance_id=instance_id).values()),
    }


def test_a_failing_statement_at_each_step_leaves_everything_as_it_was(tdb: None) -> None:
    iid = sv.start_workflow("can.stale_parent", 0, instance_id="faulty")
    sv.signal(iid, "other", "kept")
    assert drive(iid) == "running"
    store = client_store()
    # Lease it as a dispatch would (the test plays the execution that continues).
    WorkflowInstance.objects.filter(instance_id=iid).update(runnable=True)
    fence = store.instances.acquire(iid, "test-owner", 60)
    assert fence is not None
    before = state(iid)
    text = json.dumps(2)
    injector = FaultInjector(trace=True).install()
    try:
        with pytest.raises(InjectedFault):
            injector.fail_statement(r"DELETE FROM .*history", operation="continue_as_new")
            store.recovery.continue_as_new(fence, text)
        steps = max(
            s.step
            for s in injector.statements
            if s.operation == "continue_as_new" and not s.waiter_hint
        )
    finally:
        injector.uninstall()
    assert steps >= 10
    assert state(iid) == before
    for step in range(1, steps + 1):
        injector = FaultInjector().install()
        try:
            fault = injector.fail_statement(None, operation="continue_as_new", step=step)
            with pytest.raises(InjectedFault):
                store.recovery.continue_as_new(fence, text)
            assert fault.fired == 1
        finally:
            injector.uninstall()
        assert state(iid) == before, f"step {step} left a partial write"
    assert store.recovery.continue_as_new(fence, text) == 2
    with pytest.raises(sv.Fenced):
        store.recovery.continue_as_new(fence, text)  # the old epoch can write nothing more
    assert sv.describe(iid).generation == 2
    pending = SignalMessage.objects.get(instance_id=iid, channel="other")
    assert (pending.delivered_seq, pending.consumed_seq, pending.archived_generation) == (
        None,
        None,
        None,
    )


def test_replays_and_queries_read_the_current_generation_however_long_the_chain(
    tdb: None,
) -> None:
    """The archive of a long chain may pass MAX_HISTORY_EVENTS: the export says so, but a
    replay check reads only the current generation, which stays small."""
    iid = sv.start_workflow("can.count", {"total": 0, "batch": 1}, instance_id="long-chain")
    for value in range(1, 6):
        sv.signal(iid, "add", value)
    with override_settings(SELVEDGE={**settings.SELVEDGE, "MAX_HISTORY_EVENTS": 8}):
        assert drive(iid) == "running"
        assert sv.describe(iid).generation == 6
        assert len(archived(iid)) > 9
        with pytest.raises(sv.HistoryLimitExceeded):
            sv.export_history(iid)
        sv.replay_instance(iid)
        with pytest.raises(sv.QueryNotFound):
            sv.query(iid, "nothing")
        sv.signal(iid, "add", "stop")
        assert drive(iid) == "completed"
    assert sv.get_workflow_result(iid).output == {"total": 15, "generations": 6}
