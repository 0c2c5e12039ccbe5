"""Search attributes on real databases: set, described, found, kept, copied.

Every lookup is checked against instances holding values of each type, alone and
combined with the other filters; the attribute rows are read back from the table,
so what is asserted is what the next ``find_instances`` sees.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection

import selvedge_django as sv
from selvedge_django.models import HistoryEvent, WorkflowAttribute, WorkflowInstance
from selvedge_django.operations.find import iter_instances
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@sv.workflow(name="test.attr.tagger")
def tagger(ctx: sv.WorkflowContext, data: dict[str, Any]) -> dict[str, Any]:
    """Set ``first``, wait for ``go``, set ``second`` (with the time of the step)."""
    ctx.set_attributes(data["first"])
    ctx.receive("go")
    second = dict(data["second"])
    second["tagged_at"] = ctx.now()
    ctx.set_attributes(second)
    return {"done": True}


@sv.workflow(name="test.attr.bad")
def bad(ctx: sv.WorkflowContext, value: str) -> str:
    """Try a bad name or value, catch the ValueError, then set a good one."""
    attempts: dict[str, Any] = {
        "name": {"Tenant": "x"},
        "long": {"note": "x" * 256},
        "naive": {"at": datetime(2026, 1, 1)},
        "type": {"items": [1, 2]},
        "nan": {"amount": float("nan")},
        "mapping": ["tenant"],
    }
    try:
        ctx.set_attributes(attempts[value])
    except ValueError as error:
        ctx.set_attributes({"outcome": "caught"})
        return f"caught: {error}"
    return "stored"


@sv.workflow(name="test.attr.plain")
def plain(ctx: sv.WorkflowContext, data: Any) -> Any:
    return data


FAIL_ONCE: dict[str, bool] = {}


@sv.workflow(name="test.attr.fails")
def fails(ctx: sv.WorkflowContext, tag: str) -> str:
    ctx.set_attributes({"stage": "one"})
    if FAIL_ONCE.pop(tag, False):
        raise RuntimeError("fails once")
    ctx.set_attributes({"stage": "two"})
    return tag


@sv.workflow(name="test.attr.continues")
def continues(ctx: sv.WorkflowContext, n: int) -> int:
    if n == 0:
        ctx.set_attributes({"generation_one": True})
        ctx.continue_as_new(1)
    ctx.set_attributes({"later": n})
    return n


def rows(instance_id: str) -> dict[str, tuple[Any, ...]]:
    return {
        r[0]: r[1:]
        for r in WorkflowAttribute.objects.filter(instance_id=instance_id).values_list(
            "name", "kind", "text_value", "number_value"
        )
    }


def attribute_commands(instance_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(data)
        for data in HistoryEvent.objects.filter(
            instance_id=instance_id, command="attributes"
        ).values_list("data", flat=True)
    ]


# -- start and describe ------------------------------------------------------------------


def test_start_with_attributes_describes_them_with_their_types(tdb: None) -> None:
    at = datetime(2026, 3, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    iid = sv.start_workflow(
        plain,
        1,
        attributes={
            "tenant": "acme",
            "amount": 120,
            "ratio": 0.5,
            "vip": True,
            "due": at,
            "gone": None,
            "big": 2**62 + 1,
        },
    )
    attributes = sv.describe(iid).attributes
    assert attributes == {
        "tenant": "acme",
        "amount": 120,
        "ratio": 0.5,
        "vip": True,
        "due": at,
        "big": 2**62 + 1,
    }
    assert type(attributes["amount"]) is int and type(attributes["vip"]) is bool
    assert attributes["due"].utcoffset() == timedelta(0)
    assert sv.describe(iid).to_json()["attributes"]["due"] == "2026-03-01T10:30:00+00:00"
    assert sv.find_instances(instance_id=iid).instances[0].attributes == attributes
    assert sv.describe(sv.start_workflow(plain, 2)).attributes == {}


@pytest.mark.parametrize(
    "attributes",
    [
        {"Tenant": "acme"},
        {"": "x"},
        {"a" * 65: "x"},
        {"ten-ant": "x"},
        {"tenant": "x" * 256},
        {"tenant": "a\x00b"},
        {"tenant": ["acme"]},
        {"at": datetime(2026, 1, 1)},
        {"amount": float("inf")},
        {"amount": 2**63},
        {"amount": b"1"},
        ["tenant"],
        {f"n{i}": i for i in range(65)},
    ],
    ids=lambda a: repr(a)[:30],
)
def test_a_bad_attribute_at_start_raises_value_error_and_writes_nothing(
    tdb: None, attributes: Any
) -> None:
    with pytest.raises(ValueError):
        sv.start_workflow(plain, 1, instance_id="bad-start", attributes=attributes)
    assert not WorkflowInstance.objects.filter(instance_id="bad-start").exists()
    assert not WorkflowAttribute.objects.exists()


def test_a_taken_id_with_if_exists_return_writes_no_attributes(tdb: None) -> None:
    sv.start_workflow(plain, 1, instance_id="taken", attributes={"tenant": "a"})
    again = sv.start_workflow(
        plain, 1, instance_id="taken", if_exists="return", attributes={"tenant": "b", "x": 1}
    )
    assert again == "taken"
    assert sv.describe("taken").attributes == {"tenant": "a"}


# -- the workflow command ------------------------------------------------------------------


def test_set_attributes_is_recorded_once_and_replay_writes_nothing(tdb: None) -> None:
    iid = sv.start_workflow(
        tagger,
        {"first": {"tenant": "acme", "stage": "new"}, "second": {"stage": "done", "tenant": None}},
    )
    attribute_writes: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "selvedge_django_workflowattribute" in sql and not sql.lstrip().startswith("SELECT"):
            attribute_writes.append(sql)
        return execute(sql, params, many, context)

    worker = Worker()
    with connection.execute_wrapper(spy):
        run_until_idle(worker)
        assert sv.describe(iid).attributes == {"tenant": "acme", "stage": "new"}
        assert len(attribute_writes) == 1  # the first command's upsert
        sv.signal(iid, "go", None)
        run_until_idle(worker)  # replays the first command: only the second one writes
    assert sv.get_workflow_result(iid).output == {"done": True}
    # The second command: a delete (tenant None) and an upsert.
    assert len(attribute_writes) == 3
    attributes = sv.describe(iid).attributes
    assert set(attributes) == {"stage", "tagged_at"}
    assert attributes["stage"] == "done"
    assert isinstance(attributes["tagged_at"], datetime)
    commands = attribute_commands(iid)
    assert commands[0] == {"tenant": "acme", "stage": "new"}
    assert commands[1]["tenant"] is None and commands[1]["stage"] == "done"
    assert list(commands[1]["tagged_at"]) == ["$datetime"]


def test_set_attributes_under_the_workflow_cache(tdb: None, make_worker: Any) -> None:
    # A cached execution continues past its receive without replaying: the second
    # command is issued live by the kept execution and recorded once as well.
    worker = make_worker(workflow_cache={"MAX_ENTRIES": 10}, workflow_resumption_interval=0.05)
    # A worker of this process: the start is leased to it at once, with its attributes.
    iid = sv.start_workflow(
        tagger,
        {"first": {"tenant": "acme"}, "second": {"tenant": "globex", "n": 2}},
        attributes={"order": 5},
    )
    wait_until(lambda: sv.describe(iid).attributes == {"tenant": "acme", "order": 5})
    sv.signal(iid, "go", None)
    assert sv.wait_workflow(iid, timeout=20).status == "completed"
    attributes = sv.describe(iid).attributes
    assert (attributes["tenant"], attributes["n"]) == ("globex", 2)
    assert len(attribute_commands(iid)) == 2
    assert worker.settings.workflow_cache is not None
    assert sv.find_instances(attributes={"tenant": "globex"}).instances[0].instance_id == iid


@pytest.mark.parametrize("value", ["name", "long", "naive", "type", "nan", "mapping"])
def test_a_bad_attribute_in_the_workflow_raises_value_error_there(tdb: None, value: str) -> None:
    iid = sv.start_workflow(bad, value)
    run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert result.status == "completed" and result.output.startswith("caught: ")
    # Nothing of the bad call: one command (the good one), one row.
    assert attribute_commands(iid) == [{"outcome": "caught"}]
    assert sv.describe(iid).attributes == {"outcome": "caught"}


# -- find_instances --------------------------------------------------------------------------


@pytest.fixture
def population(tdb: None) -> dict[str, str]:
    """Six instances with attributes of every type, started one second apart."""
    specs: dict[str, dict[str, Any]] = {
        "p1": {"tenant": "acme", "amount": 50, "vip": True, "due": T0, "region": "eu"},
        "p2": {"tenant": "acme", "amount": 100.0, "vip": False, "due": T0 + timedelta(days=1)},
        "p3": {"tenant": "acme", "amount": 150, "region": "us", "due": T0 + timedelta(days=2)},
        "p4": {"tenant": "globex", "amount": 200, "vip": True, "region": "eu"},
        "p5": {"tenant": "globex", "amount": "100", "region": "asia"},
        "p6": {"tenant": "initech"},
    }
    from selvedge_django.operations.instances import start_at

    for i, (iid, attributes) in enumerate(specs.items()):
        start_at(
            "test.attr.plain",
            None,
            instance_id=iid,
            attributes=attributes,
            started_at=T0 + timedelta(seconds=i),
        )
    return {iid: iid for iid in specs}


def found(**filters: Any) -> list[str]:
    return [d.instance_id for d in sv.find_instances(**filters, limit=100).instances]


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"tenant": "acme"}, ["p3", "p2", "p1"]),
        ({"tenant__exact": "globex"}, ["p5", "p4"]),
        ({"tenant": "nobody"}, []),
        # Numbers by value: 100 matches 100.0, never the string "100".
        ({"amount": 100}, ["p2"]),
        ({"amount": 100.0}, ["p2"]),
        ({"amount": "100"}, ["p5"]),
        ({"amount__gt": 100}, ["p4", "p3"]),
        ({"amount__gte": 100}, ["p4", "p3", "p2"]),
        ({"amount__lt": 100}, ["p1"]),
        ({"amount__lte": 100.0}, ["p2", "p1"]),
        ({"amount__in": [50, 200]}, ["p4", "p1"]),
        ({"amount__in": ["100", 150]}, ["p5", "p3"]),
        # Bools are not numbers, and only exact or in.
        ({"vip": True}, ["p4", "p1"]),
        ({"vip": False}, ["p2"]),
        ({"vip__in": [True, False]}, ["p4", "p2", "p1"]),
        ({"vip": 1}, []),
        # Datetimes, in any timezone.
        ({"due": T0.astimezone(timezone(timedelta(hours=-5)))}, ["p1"]),
        ({"due__gt": T0}, ["p3", "p2"]),
        ({"due__gte": T0 + timedelta(days=1)}, ["p3", "p2"]),
        ({"due__lt": T0 + timedelta(days=2)}, ["p2", "p1"]),
        ({"due__lte": T0}, ["p1"]),
        ({"due__in": [T0, T0 + timedelta(days=2)]}, ["p3", "p1"]),
        # Strings compare as strings.
        ({"region__in": ["eu", "us"]}, ["p4", "p3", "p1"]),
        ({"region__gt": "eu"}, ["p3"]),
        ({"region__gte": "eu"}, ["p4", "p3", "p1"]),
        ({"region__lt": "eu"}, ["p5"]),
        ({"region__lte": "eu"}, ["p5", "p4", "p1"]),
        # Several conditions: AND.
        ({"tenant": "acme", "amount__gte": 100}, ["p3", "p2"]),
        ({"tenant": "acme", "region__in": ["eu", "us"], "vip": True}, ["p1"]),
        ({"tenant__in": ["acme", "globex"], "region": "eu", "amount__lt": 200}, ["p1"]),
        ({"tenant": "initech", "region": "eu"}, []),
    ],
)
def test_every_lookup_finds_exactly_its_instances(
    population: dict[str, str], attributes: dict[str, Any], expected: list[str]
) -> None:
    assert found(attributes=attributes) == expected


def test_attribute_filters_combine_with_the_other_filters(population: dict[str, str]) -> None:
    sv.start_workflow(
        tagger, {"first": {}, "second": {}}, instance_id="t1", attributes={"tenant": "acme"}
    )
    assert found(attributes={"tenant": "acme"}) == ["t1", "p3", "p2", "p1"]
    assert found(attributes={"tenant": "acme"}, workflow_name="attr.plain") == ["p3", "p2", "p1"]
    assert found(attributes={"tenant": "acme"}, workflow_name="tagger") == ["t1"]
    assert found(attributes={"tenant": "acme"}, instance_id="p") == ["p3", "p2", "p1"]
    assert found(attributes={"tenant": "acme"}, started_after=T0) == ["t1", "p3", "p2"]
    assert found(attributes={"tenant": "acme"}, started_before=T0 + timedelta(seconds=2)) == [
        "p2",
        "p1",
    ]
    assert found(attributes={"tenant": "acme"}, status="completed") == []
    run_until_idle(Worker())
    assert found(attributes={"tenant": "acme"}, status="completed") == ["p3", "p2", "p1"]
    assert found(attributes={"tenant": "acme"}, status="running") == ["t1"]


def test_attribute_filters_page_with_the_cursor(population: dict[str, str]) -> None:
    seen: list[str] = []
    token = None
    while True:
        page = sv.find_instances(attributes={"amount__gte": 50}, limit=2, page_token=token)
        seen += [d.instance_id for d in page.instances]
        assert len(page.instances) <= 2
        if not page.has_more:
            break
        token = page.next_page_token
    assert seen == ["p4", "p3", "p2", "p1"]
    assert [d.instance_id for d in iter_instances(limit=3, attributes={"tenant": "acme"})] == [
        "p3",
        "p2",
        "p1",
    ]


@pytest.mark.parametrize(
    "attributes",
    [
        {"tenant__contains": "ac"},
        {"tenant__iexact": "acme"},
        {"Tenant": "acme"},
        {"tenant": None},
        {"tenant": ["acme"]},
        {"tenant__in": "acme"},
        {"tenant__in": []},
        {"vip__gt": False},
        {"due__gt": datetime(2026, 1, 1)},
        {"amount__lt": float("nan")},
        {"tenant": "x" * 256},
        ["tenant"],
    ],
    ids=lambda a: repr(a)[:30],
)
def test_a_bad_filter_raises_value_error(population: dict[str, str], attributes: Any) -> None:
    with pytest.raises(ValueError):
        sv.find_instances(attributes=attributes)


# -- lifecycle ---------------------------------------------------------------------------------


def test_fork_copies_attributes_and_resume_keeps_them(tdb: None) -> None:
    FAIL_ONCE["r"] = True
    iid = sv.start_workflow(fails, "r", attributes={"tenant": "acme", "order": 7})
    run_until_idle(Worker())
    assert sv.describe(iid).status == "failed"
    assert sv.describe(iid).attributes == {"tenant": "acme", "order": 7, "stage": "one"}
    fork = sv.fork_workflow(iid)
    assert sv.describe(fork).attributes == {"tenant": "acme", "order": 7, "stage": "one"}
    sv.resume_workflow(iid, reason="fixed")
    assert sv.describe(iid).attributes == {"tenant": "acme", "order": 7, "stage": "one"}
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == "r"
    assert sv.describe(iid).attributes == {"tenant": "acme", "order": 7, "stage": "two"}
    assert sv.get_workflow_result(fork).output == "r"
    assert sorted(found(attributes={"order": 7, "stage": "two"})) == sorted([iid, fork])


def test_continue_as_new_keeps_attributes(tdb: None) -> None:
    iid = sv.start_workflow(continues, 0, attributes={"tenant": "acme"})
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == 1
    assert sv.describe(iid).attributes == {"tenant": "acme", "generation_one": True, "later": 1}


@sv.workflow(name="test.attr.queried")
def queried(ctx: sv.WorkflowContext, data: Any) -> None:
    ctx.set_attributes({"stage": "waiting"})
    ctx.set_query_handler("stage", lambda: "waiting")
    ctx.receive("never")


def test_a_handle_starts_with_attributes_and_a_query_replay_writes_none(tdb: None) -> None:
    handle = queried.start(None, attributes={"tenant": "acme"})
    run_until_idle(Worker())
    writes: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not sql.lstrip().upper().startswith(("SELECT", "SAVEPOINT", "RELEASE", "BEGIN")):
            writes.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        assert sv.query(handle.id, "stage") == "waiting"
    assert not [w for w in writes if "workflowattribute" in w or "historyevent" in w]
    assert handle.describe().attributes == {"tenant": "acme", "stage": "waiting"}
    assert len(attribute_commands(handle.id)) == 1


def test_a_set_attributes_under_a_lost_lease_writes_nothing(tdb: None) -> None:
    from selvedge_django.engine.codec import Codec
    from selvedge_django.engine.events import EV_ATTRIBUTES_SET, Fence, HistoryRow
    from selvedge_django.storage import store_for

    store = store_for("default", Codec())
    iid = sv.start_workflow(plain, 1, attributes={"tenant": "acme"})
    (fence,) = store.instances.acquire_batch("w1", 30.0, 10, None)
    assert fence.instance_id == iid
    row = HistoryRow("#1:attributes", 1, "attributes", EV_ATTRIBUTES_SET, '{"tenant":"x"}', None, 1)
    stale = Fence(iid, fence.owner, fence.epoch - 1)
    with pytest.raises(sv.Fenced):
        store.set_attributes(stale, row, {"tenant": "globex", "n": 1})
    assert sv.describe(iid).attributes == {"tenant": "acme"}
    assert attribute_commands(iid) == []
    store.set_attributes(fence, row, {"tenant": "globex", "n": 1})
    assert sv.describe(iid).attributes == {"tenant": "globex", "n": 1}
    assert attribute_commands(iid) == [{"tenant": "x"}]


def test_attributes_stay_clear_text_and_searchable_under_a_payload_codec(tdb: None) -> None:
    from django.conf import settings
    from django.test import override_settings

    from selvedge_django.codecs import FernetCodec

    codec = {"PAYLOAD_CODEC": "selvedge_django.codecs.FernetCodec"}
    codec["PAYLOAD_KEYS"] = [FernetCodec.generate_key()]  # type: ignore[assignment]
    with override_settings(SELVEDGE={**settings.SELVEDGE, **codec}):
        iid = sv.start_workflow(
            tagger,
            {"first": {"stage": "new"}, "second": {"stage": "done"}},
            attributes={"tenant": "acme-secretive"},
        )
        run_until_idle(Worker())
        sv.signal(iid, "go", None)
        run_until_idle(Worker())
        assert sv.get_workflow_result(iid).output == {"done": True}
        assert found(attributes={"tenant": "acme-secretive", "stage": "done"}) == [iid]
        # The input is sealed; the attribute rows and the command's row are not (docs say so).
        assert "$codec" in json.dumps(WorkflowInstance.objects.get(instance_id=iid).input)
        assert rows(iid)["tenant"] == ("s", "acme-secretive", None)
        assert attribute_commands(iid)[0] == {"stage": "new"}
