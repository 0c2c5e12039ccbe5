"""History export, strict parsing and replay checks, with golden histories.

``tests/histories/`` holds ``selvedge.history/v1`` documents recorded from
``ops.golden.order`` (tests/ops_workflows.py) and from older versions of it.
The ones recorded from today's code must replay cleanly; the ones recorded
from older versions must fail the way a deploy gate would report them.
``SELVEDGE_WRITE_GOLDEN=1 python -m pytest tests/integration/test_history.py -k golden``
records them again (tracebacks blanked, signal ids numbered from 1).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

import selvedge_django as sv
from selvedge_django import registry
from selvedge_django.engine.portable import ABSENT, FORMAT
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.worker import Worker
from tests import ops_workflows
from tests.ops_workflows import price, receipt

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
WRITE_GOLDEN = os.environ.get("SELVEDGE_WRITE_GOLDEN") == "1"
ORDER = {"sku": "tee", "quantity": 3}


@pytest.fixture
def clock(tdb: None, selvedge_clock: ControllableClock) -> ControllableClock:
    return selvedge_clock


@pytest.fixture
def scratch() -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    """(Re)define a workflow under a name for one test; the original comes back after."""
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


def arun(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine like an async view would, closing its thread's connection after."""

    async def main() -> Any:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def load(name: str) -> sv.RecordedHistory:
    return sv.parse_history((HISTORIES / name).read_bytes())


def golden_doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((HISTORIES / name).read_text(encoding="utf-8"))
    return doc


def normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """Blank tracebacks (they hold file paths) and number signals from 1 (ids are serial)."""
    doc = copy.deepcopy(doc)

    def scrub(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("traceback"), str):
                value["traceback"] = ""
            for item in value.values():
                scrub(item)
        elif isinstance(value, list):
            for item in value:
                scrub(item)

    scrub(doc)
    for number, signal in enumerate(doc["signals"], start=1):
        signal["id"] = number
    return doc


def step(worker: Worker) -> None:
    run_until_idle(worker)


# -- recording the golden scenarios -------------------------------------------------------


def record_order(clock: ControllableClock, instance_id: str, outcome: str) -> None:
    """Drive one ops.golden.order instance to ``outcome`` with a controllable clock."""
    worker = Worker()
    sv.start_workflow("ops.golden.order", ORDER, instance_id=instance_id)
    step(worker)
    if outcome == "running":
        return
    if outcome == "cancelled":
        sv.cancel_workflow(instance_id, "customer changed their mind")
        step(worker)
        return
    sv.signal(
        instance_id,
        "approve",
        {"by": "bob", "reject": True} if outcome == "failed" else {"by": "ada"},
    )
    step(worker)
    clock.advance(61)
    step(worker)


def order_asking_first(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """An older ops.golden.order: asked for approval before pricing."""
    approval = ctx.receive("approve")
    quote = price.execute(ctx, data)
    return {"sku": quote["sku"], "total": quote["cents"], "approved_by": approval["by"]}


def order_in_euros(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """An older ops.golden.order: the same commands, but the total was in euros."""
    result = ops_workflows.order.fn(ctx, data)
    result["total"] = result["total"] / 100
    return result


def order_with_a_check(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """An older ops.golden.order: priced the order again after the receipt."""
    result = ops_workflows.order.fn(ctx, data)
    price.execute(ctx, data)
    return result


CURRENT = {
    "order_completed.json": ("golden-completed", "completed"),
    "order_running.json": ("golden-running", "running"),
    "order_failed.json": ("golden-failed", "failed"),
    "order_cancelled.json": ("golden-cancelled", "cancelled"),
}
OLDER = {
    "order_asked_first.json": ("golden-asked-first", order_asking_first),
    "order_in_euros.json": ("golden-in-euros", order_in_euros),
    "order_extra_step.json": ("golden-extra-step", order_with_a_check),
}


def write(name: str, doc: dict[str, Any]) -> None:
    text = json.dumps(normalized(doc), indent=2, ensure_ascii=False) + "\n"
    (HISTORIES / name).write_text(text, encoding="utf-8")


def write_reformatted(exported: dict[str, Any]) -> None:
    """The completed history with its output's keys reversed and its numbers respelled."""
    doc = normalized(exported)
    output = doc["instance"]["output"]
    doc["instance"]["output"] = "@OUTPUT@"

    def spelled(value: Any) -> str:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f"{float(value):e}"  # 750 -> 7.500000e+02
        return json.dumps(value, ensure_ascii=False)

    members = ", ".join(f"{json.dumps(k)}: {spelled(v)}" for k, v in reversed(output.items()))
    text = json.dumps(doc, indent=2, ensure_ascii=False).replace('"@OUTPUT@"', "{" + members + "}")
    (HISTORIES / "order_completed_reformatted.json").write_text(text + "\n", encoding="utf-8")


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_golden_exports_of_todays_code_match_the_checked_in_files(
    clock: ControllableClock, name: str
) -> None:
    instance_id, outcome = CURRENT[name]
    record_order(clock, instance_id, outcome)
    assert sv.describe(instance_id).status == outcome
    exported = json.loads(sv.export_history(instance_id).to_json())
    if WRITE_GOLDEN:
        write(name, exported)
        if name == "order_completed.json":
            write_reformatted(exported)
    assert normalized(exported) == golden_doc(name)


@pytest.mark.parametrize("name", sorted(OLDER))
def test_golden_histories_of_older_code(clock: ControllableClock, scratch: Any, name: str) -> None:
    """What the older versions recorded (written with SELVEDGE_WRITE_GOLDEN=1)."""
    instance_id, fn = OLDER[name]
    scratch("ops.golden.order", fn)
    record_order(clock, instance_id, "completed")
    assert sv.describe(instance_id).status == "completed"
    exported = json.loads(sv.export_history(instance_id).to_json())
    if WRITE_GOLDEN:
        write(name, exported)
    sv.replay_instance(instance_id)  # it replays against the code that recorded it
    assert normalized(exported) == golden_doc(name)


# -- replaying golden histories (no database at all: replay never touches storage) ------


@pytest.mark.parametrize(
    "name",
    [
        "order_completed.json",
        "order_completed_reformatted.json",
        "order_running.json",
        "order_failed.json",
        "order_cancelled.json",
    ],
)
def test_golden_histories_of_todays_code_replay_cleanly_without_a_database(name: str) -> None:
    history = load(name)
    assert history.format == FORMAT
    sv.replay_history(history)  # pytest-django refuses any database access here


def test_the_reformatted_history_differs_only_in_spelling() -> None:
    raw = (HISTORIES / "order_completed_reformatted.json").read_text()
    assert "7.500000e+02" in raw and "6.100000e+01" in raw
    plain, reformatted = load("order_completed.json"), load("order_completed_reformatted.json")
    assert list(plain.instance.output) != list(reformatted.instance.output)  # key order
    assert plain.to_dict() == reformatted.to_dict()


def test_a_history_recorded_before_a_reordering_is_nondeterministic() -> None:
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(load("order_asked_first.json"))
    error = caught.value
    assert error.instance_id == "golden-asked-first"
    divergence = error.divergence
    assert isinstance(divergence, sv.NondeterminismError)
    assert (divergence.expected, divergence.actual) == ("receive", "activity")
    assert error.__cause__ is divergence
    assert "golden-asked-first" in str(error) and "receive" in str(divergence)


def test_a_history_with_a_changed_outcome_is_a_replay_outcome_error() -> None:
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(load("order_in_euros.json"))
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.ReplayOutcomeError)
    assert (divergence.recorded_status, divergence.replayed_status) == ("completed", "completed")
    assert divergence.recorded["total"] == 7.5
    assert divergence.replayed["total"] == 750
    assert caught.value.workflow_error is None


def test_a_history_with_leftover_commands_is_nondeterministic() -> None:
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(load("order_extra_step.json"))
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.NondeterminismError)
    assert divergence.actual == "return" and divergence.expected == "activity"


def test_a_closed_history_must_reach_its_recorded_close() -> None:
    doc = golden_doc("order_completed.json")
    # Keep the commands before the sleep and the close: replay stops at the sleep.
    doc["events"] = [e for e in doc["events"] if e["command"] == "close" or e["seq"] <= 3]
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(sv.parse_history(json.dumps(doc)))
    assert isinstance(caught.value.divergence, sv.NondeterminismError)
    assert "before the recorded close" in str(caught.value.divergence)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda d: d["instance"]["output"].update(message="order accepted"), id="message"
        ),
        pytest.param(lambda d: d["instance"]["output"].update(type="OrderLost"), id="type"),
        pytest.param(lambda d: d["instance"].update(status="cancelled"), id="status"),
    ],
)
def test_a_failed_outcome_must_keep_its_kind_and_message(change: Callable[[Any], None]) -> None:
    doc = golden_doc("order_failed.json")
    change(doc)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(sv.parse_history(json.dumps(doc)))
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.ReplayOutcomeError)
    assert divergence.replayed_status == "failed"
    assert isinstance(caught.value.workflow_error, sv.ApplicationError)
    assert caught.value.workflow_error.message == "order rejected"


def test_a_cancelled_outcome_must_stay_cancelled() -> None:
    doc = golden_doc("order_cancelled.json")
    doc["instance"]["status"] = "completed"
    doc["instance"]["output"] = {"sku": "tee"}
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(sv.parse_history(json.dumps(doc)))
    divergence = caught.value.divergence
    assert isinstance(divergence, sv.ReplayOutcomeError)
    assert divergence.replayed_status == "cancelled"
    assert isinstance(caught.value.workflow_error, sv.WorkflowCancelled)


def test_a_running_history_is_checked_up_to_its_frontier(scratch: Any) -> None:
    history = load("order_running.json")
    sv.replay_history(history)

    def reordered(ctx: sv.WorkflowContext, data: Any) -> Any:
        ctx.now()  # a new first command
        return ops_workflows.order.fn(ctx, data)

    scratch("ops.golden.order", reordered)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(history)
    assert isinstance(caught.value.divergence, sv.NondeterminismError)


def test_replay_names_an_unregistered_workflow() -> None:
    doc = golden_doc("order_completed.json")
    doc["instance"]["workflow_name"] = "ops.nobody.registered.this"
    with pytest.raises(sv.WorkflowNotRegistered) as caught:
        sv.replay_history(sv.parse_history(json.dumps(doc)))
    assert caught.value.workflow_name == "ops.nobody.registered.this"


# -- malformed histories ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("malformed_not_json.json", "not JSON"),
        ("malformed_unknown_field.json", "events[1].payload"),
        ("malformed_other_version.json", "selvedge.history/v2"),
        ("malformed_wrong_type.json", "events[0].seq"),
    ],
)
def test_malformed_golden_files_are_unsupported(name: str, named: str) -> None:
    with pytest.raises(sv.UnsupportedHistoryFormat) as caught:
        load(name)
    assert named in str(caught.value)
    assert isinstance(caught.value, ValueError)


def _doc() -> dict[str, Any]:
    return golden_doc("order_completed.json")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        del target[last]

    return change


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_set("lease_owner", "w1"), "unknown field lease_owner"),
        (_set("instance.lease_epoch", 3), "instance.lease_epoch"),
        (_set("events.0.owner", "w1"), "events[0].owner"),
        (_set("signals.0.payload", {"by": "ada"}), "signals[0].payload"),
        (_drop("format"), "format"),
        (_set("format", "selvedge.history/v1.1"), "selvedge.history/v1.1"),
        (_set("format", "temporal.history/v1"), "temporal.history/v1"),
        (_set("format", 1), "format"),
        (_drop("instance"), "instance"),
        (_set("instance", []), "instance must be an object"),
        (_drop("instance.workflow_name"), "instance.workflow_name"),
        (_set("instance.status", "paused"), "instance.status"),
        (_set("instance.cancel_requested", "no"), "instance.cancel_requested"),
        (_set("instance.instance_id", 7), "instance.instance_id"),
        (_set("events", {}), "events"),
        (_set("events.0", "activity"), "events[0]"),
        (_set("events.0.seq", "1"), "events[0].seq"),
        (_set("events.0.seq", True), "events[0].seq"),
        (_set("events.0.delivered_seq", 1.5), "events[0].delivered_seq"),
        (_drop("events.0.key"), "events[0].key"),
        (_set("events.0.data_type", "protobuf"), "events[0].data_type"),
        (_set("events.0.binary", "AAEC"), "events[0].binary"),
        (_set("events.1.key", "#1:ops.golden.price"), "events[1]"),
        (_set("signals", {}), "signals"),
        (_set("events", "none"), "events"),
        (_set("signals.0.channel", ["approve"]), "signals[0].channel"),
    ],
)
def test_parse_history_is_strict_and_names_the_offending_field(
    change: Callable[[dict[str, Any]], None], named: str
) -> None:
    doc = _doc()
    change(doc)
    with pytest.raises(sv.UnsupportedHistoryFormat) as caught:
        sv.parse_history(json.dumps(doc))
    assert named in str(caught.value)


# -- histories exported by the Go engine -------------------------------------------------


def test_a_go_export_with_null_lists_loads_and_replays() -> None:
    """Go marshals an instance without events or signals with ``null`` lists."""
    history = load("go_started_order.json")
    assert (history.events, history.signals) == ([], [])
    assert history.instance.instance_id == "go-started"
    sv.replay_history(history)  # stops at the first (unrecorded) command
    assert json.loads(history.to_json())["events"] == []


@pytest.mark.parametrize(
    ("path", "zero"),
    [
        ("instance.cancel_requested", False),
        ("instance.cancel_reason", ""),
        ("instance.parent_instance_id", ""),
        ("instance.parent_key", ""),
        ("events.0.delivered_seq", 0),
        ("events.0.data_type", "json"),
        ("events.0.binary", None),
        ("events.6.seq", 0),
        ("signals.0.delivered_seq", 0),
        ("signals.0.consumed_seq", 0),
    ],
)
def test_null_stands_for_a_go_zero_value(path: str, zero: Any) -> None:
    doc = _doc()
    _set(path, None)(doc)
    history = sv.parse_history(json.dumps(doc))
    reference = _doc()
    _set(path, zero)(reference)
    assert history.to_dict() == sv.parse_history(json.dumps(reference)).to_dict()


def test_an_empty_data_type_is_json() -> None:
    doc = _doc()
    doc["events"][0]["data_type"] = ""
    assert sv.parse_history(json.dumps(doc)).to_dict() == load("order_completed.json").to_dict()


def test_null_keeps_its_meaning_where_it_is_a_recorded_value() -> None:
    doc = _doc()
    doc["events"][1]["data"] = None  # a recorded JSON null, not a missing value
    doc["events"][1]["reservation"] = None
    doc["instance"]["input"] = None
    history = sv.parse_history(json.dumps(doc))
    assert history.events[1].data is None and history.events[1].data is not ABSENT
    assert history.events[1].reservation is None
    assert history.instance.input is None


@pytest.mark.parametrize(
    "path",
    [
        "instance.instance_id",
        "instance.workflow_name",
        "instance.status",
        "events.0.key",
        "events.0.command",
        "events.0.event_type",
        "signals.0.id",
        "signals.0.channel",
    ],
)
def test_null_is_refused_where_no_zero_value_is_valid(path: str) -> None:
    doc = _doc()
    _set(path, None)(doc)
    with pytest.raises(sv.UnsupportedHistoryFormat) as caught:
        sv.parse_history(json.dumps(doc))
    assert path.replace(".0.", "[0].") in str(caught.value)


def test_unknown_fields_are_refused_in_go_exports_too() -> None:
    doc = golden_doc("go_started_order.json")
    doc["instance"]["memo"] = None
    with pytest.raises(sv.UnsupportedHistoryFormat, match=r"instance\.memo"):
        sv.parse_history(json.dumps(doc))


@pytest.mark.parametrize(
    "data",
    [b"\xff\xfe{}", "", "[]", '"selvedge.history/v1"', "{", "null", 42, None, {"format": FORMAT}],
    ids=["not-utf8", "empty", "array", "string", "truncated", "null", "int", "none", "dict"],
)
def test_parse_history_rejects_what_is_not_a_history_document(data: Any) -> None:
    with pytest.raises(sv.UnsupportedHistoryFormat):
        sv.parse_history(data)


def test_parse_history_accepts_bytes_and_round_trips() -> None:
    raw = (HISTORIES / "order_completed.json").read_bytes()
    history = sv.parse_history(raw)
    assert sv.parse_history(bytearray(raw)).to_dict() == history.to_dict()
    again = sv.parse_history(history.to_json())
    assert again.to_dict() == history.to_dict()
    assert json.loads(history.to_json(indent=2)) == json.loads(raw)


# -- exporting --------------------------------------------------------------------------


@sv.activity(name="ops.hist.nothing")
def nothing(_: Any) -> None:
    return None


@sv.activity(name="ops.hist.unserved", queue="ops-unserved")
def unserved(_: Any) -> str:
    return "never runs in these tests"


@sv.workflow(name="ops.hist.nulls")
def nulls(ctx: sv.WorkflowContext, _: Any) -> None:
    """A recorded null, a reservation without a value, then a wait."""
    nothing.execute(ctx)
    unserved.execute_async(ctx)
    ctx.receive("go")


def test_absent_values_stay_distinct_from_json_null(clock: ControllableClock) -> None:
    worker = Worker(activity_queues=[""])
    iid = sv.start_workflow(nulls, instance_id="nulls")
    run_until_idle(worker)
    history = sv.export_history(iid)
    doc = json.loads(history.to_json())
    assert "output" not in doc["instance"]  # running: no output yet
    assert doc["instance"]["input"] is None  # an input of None was recorded as null
    returned_null, reserved = doc["events"]
    assert returned_null["data"] is None and "data" in returned_null
    assert "data" not in reserved and reserved["reservation"]["name"] == "ops.hist.unserved"
    parsed = sv.parse_history(history.to_json())
    assert parsed.events[0].data is None
    assert parsed.events[1].data is ABSENT
    assert parsed.to_json() == history.to_json()
    sv.replay_history(parsed)

    sv.signal(iid, "go")
    run_until_idle(worker)
    closed = json.loads(sv.export_history(iid).to_json())
    assert closed["instance"]["status"] == "completed"
    assert "output" in closed["instance"] and closed["instance"]["output"] is None
    assert closed["events"][-1]["command"] == "close"
    sv.replay_instance(iid)


def test_export_carries_no_lease_owner_or_signal_payload(clock: ControllableClock) -> None:
    worker = Worker(worker_id="exporting-worker-17")
    iid = sv.start_workflow("ops.golden.order", ORDER)
    run_until_idle(worker)
    sv.signal(iid, "elsewhere", {"secret": "s3cr3t-payload"})
    sv.signal(iid, "approve", {"by": "ada"})
    run_until_idle(worker)
    text = sv.export_history(iid).to_json()
    assert "s3cr3t-payload" not in text and "exporting-worker-17" not in text
    doc = json.loads(text)
    assert set(doc) == {"format", "instance", "events", "signals"}
    assert set(doc["instance"]) == {
        "instance_id",
        "workflow_name",
        "status",
        "input",
        "cancel_requested",
        "cancel_reason",
        "parent_instance_id",
        "parent_key",
        # Where the last execution waited: a position, not an owner.
        "parked_seq",
        "parked_key",
    }
    for event in doc["events"]:
        assert set(event) <= {
            "seq",
            "key",
            "command",
            "event_type",
            "data",
            "data_type",
            "binary",
            "reservation",
            "delivered_seq",
        }
    by_channel = {s["channel"]: s for s in doc["signals"]}
    assert set(by_channel["elsewhere"]) == {"id", "channel", "delivered_seq", "consumed_seq"}
    assert by_channel["elsewhere"]["consumed_seq"] == 0  # delivered with "approve", not consumed
    assert by_channel["elsewhere"]["delivered_seq"] == by_channel["approve"]["consumed_seq"] > 0


def test_a_childs_history_names_its_parent(clock: ControllableClock) -> None:
    record_order(clock, "with-child", "completed")
    (child,) = sv.find_instances(workflow_name="ops.golden.receipt").instances
    doc = json.loads(sv.export_history(child.instance_id).to_json())
    assert doc["instance"]["parent_instance_id"] == "with-child"
    assert doc["instance"]["parent_key"] == child.parent_key != ""
    assert doc["instance"]["output"] == "receipt for tee: 750 cents"
    sv.replay_instance(child.instance_id)


def test_export_and_replay_of_unknown_instances(tdb: None) -> None:
    with pytest.raises(sv.WorkflowNotFound):
        sv.export_history("no-such-instance")
    with pytest.raises(sv.WorkflowNotFound):
        sv.replay_instance("no-such-instance")
    with pytest.raises(sv.WorkflowNotFound):
        arun(sv.aexport_history("no-such-instance"))


def test_async_export(clock: ControllableClock) -> None:
    record_order(clock, "async-export", "running")
    history = arun(sv.aexport_history("async-export"))
    assert history.to_dict() == sv.export_history("async-export").to_dict()


# -- comparing outputs as JSON values --------------------------------------------------------


@sv.workflow(name="ops.hist.shapes")
def shapes(ctx: sv.WorkflowContext, _: Any) -> Any:
    """An output whose Python value is not its JSON value: a tuple, a datetime, int keys."""
    return {"pair": (1, 2), "when": ctx.now(), "by_number": {1: "one"}, "flag": True}


def test_outputs_are_compared_as_the_json_that_was_recorded(clock: ControllableClock) -> None:
    iid = sv.start_workflow(shapes)
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output["pair"] == [1, 2]
    sv.replay_instance(iid)


@pytest.mark.parametrize(
    ("recorded", "diverges"),
    [
        ({"b": [1, 2.0], "a": {"y": None, "x": 1e3}}, False),
        ({"a": {"x": 1000, "y": None}, "b": [1, 2]}, False),
        ({"a": {"x": 1000, "y": None}, "b": [2, 1]}, True),
        ({"a": {"x": 1000, "y": None}, "b": [True, 2]}, True),
        ({"a": {"x": 1000, "y": False}, "b": [1, 2]}, True),
        ({"a": {"x": 1000}, "b": [1, 2]}, True),
        ({"a": {"x": "1000", "y": None}, "b": [1, 2]}, True),
    ],
)
def test_json_equality_of_outputs(
    clock: ControllableClock, scratch: Any, recorded: Any, diverges: bool
) -> None:
    scratch("ops.hist.value", lambda ctx, _: {"a": {"x": 1000, "y": None}, "b": [1, 2]})
    iid = sv.start_workflow("ops.hist.value")
    run_until_idle(Worker())
    doc = json.loads(sv.export_history(iid).to_json())
    doc["instance"]["output"] = recorded
    history = sv.parse_history(json.dumps(doc))
    if not diverges:
        sv.replay_history(history)
        return
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(history)
    assert isinstance(caught.value.divergence, sv.ReplayOutcomeError)


def test_replay_error_carries_the_divergence_and_the_workflow_error(
    clock: ControllableClock, scratch: Any
) -> None:
    iid = sv.start_workflow(ops_workflows.echo, {"n": 1})
    run_until_idle(Worker())
    history = sv.export_history(iid)

    def broken(ctx: sv.WorkflowContext, value: Any) -> Any:
        raise KeyError("field n was renamed")

    scratch("ops.echo", broken)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(history)
    error = caught.value
    assert isinstance(error.divergence, sv.ReplayOutcomeError)
    assert (error.divergence.recorded_status, error.divergence.replayed_status) == (
        "completed",
        "failed",
    )
    assert isinstance(error.workflow_error, KeyError)
    assert error.__cause__ is error.divergence
    assert isinstance(error, sv.SelvedgeError)


def test_a_workflow_whose_output_could_not_be_encoded_replays_as_the_same_failure(
    clock: ControllableClock, scratch: Any
) -> None:
    scratch("ops.hist.unencodable", lambda ctx, _: {"set": {1, 2}})
    iid = sv.start_workflow("ops.hist.unencodable")
    run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert result.error.type == "OutputEncodingError"  # type: ignore[union-attr]
    sv.replay_instance(iid)


def test_the_parents_golden_history_records_the_childs_output() -> None:
    """The child's outcome is part of the parent's history: replay never runs the child."""
    history = load("order_completed.json")
    (child_event,) = [e for e in history.events if e.command == "child"]
    assert child_event.data == receipt.fn(None, {"sku": "tee", "cents": 750})  # type: ignore[arg-type]


# -- what exports disclose, and the redacting export -----------------------------------

SECRET_CARD = "4111-1111-1111-1111"
SECRET_PAYLOAD = "approved-by-alice@example.com"


def _secret_instance(instance_id: str) -> str:
    worker = Worker()
    iid = sv.start_workflow("disclosure.order", {"card": SECRET_CARD}, instance_id=instance_id)
    sv.signal(iid, "approve", SECRET_PAYLOAD)
    run_until_idle(worker)
    assert sv.get_workflow_result(iid).status == "completed"
    return iid


def test_a_default_export_holds_consumed_signal_payloads_in_its_events(tdb: None) -> None:
    iid = _secret_instance("plain-export")
    doc = json.loads(sv.export_history(iid).to_json())
    assert all(set(s) == {"id", "channel", "delivered_seq", "consumed_seq"} for s in doc["signals"])
    assert [e["data"] for e in doc["events"] if e["command"] == "receive"] == [SECRET_PAYLOAD]


def test_a_redacted_export_replaces_every_value_by_its_size_and_a_keyed_hash(tdb: None) -> None:
    iid = _secret_instance("redacted-export")
    text = sv.export_history(iid, redact=True).to_json()
    assert SECRET_CARD not in text and SECRET_PAYLOAD not in text
    assert "tttt" not in text  # the activity result
    doc = json.loads(text)
    marker = doc["instance"]["input"]["$redacted"]
    assert marker["bytes"] == len(json.dumps({"card": SECRET_CARD}, separators=(",", ":")))
    assert len(marker["hmac_sha256"]) == 64
    values = [e["data"] for e in doc["events"] if "data" in e]
    assert values and all(set(v) == {"$redacted"} for v in values)
    # Equal values hash equally, so a redacted export still shows what repeats.
    again = json.loads(sv.export_history(iid, redact=True).to_json())
    assert again == doc
    # Still a selvedge.history/v1 document: parse_history takes it.
    assert sv.parse_history(text).instance.instance_id == iid


def test_runselvedge_export_history_redacts_on_request(tdb: None) -> None:
    from io import StringIO

    from django.core.management import call_command

    iid = _secret_instance("cli-export")
    plain, redacted = StringIO(), StringIO()
    call_command("runselvedge", "export-history", iid, stdout=plain)
    call_command("runselvedge", "export-history", iid, "--redact", stdout=redacted)
    assert SECRET_PAYLOAD in plain.getvalue()
    assert SECRET_PAYLOAD not in redacted.getvalue() and SECRET_CARD not in redacted.getvalue()
    assert '"$redacted"' in redacted.getvalue()
