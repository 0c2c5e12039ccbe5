"""The client API on a real database: start, read, wait, list and find workflows."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.models import WorkflowInstance
from tests.testapp.models import Ledger
from tests.testapp.workflows.basics import ledger, sum3

T = TypeVar("T")


# -- workflows and activities of these tests --------------------------------------------


class OrderRejected(Exception):
    """Raised by the client tests' workflows and activities."""


@sv.workflow(name="test.client.echo")
def echo(ctx: sv.WorkflowContext, data: Any) -> Any:
    return data


@sv.workflow(name="test.client.reject")
def reject(ctx: sv.WorkflowContext, data: dict[str, Any]) -> None:
    if data.get("application"):
        raise sv.ApplicationError("card declined", type="PaymentDeclined", details={"code": 51})
    raise OrderRejected(f"order {data['order']} rejected")


@sv.activity(
    name="test.client.flaky_step",
    queue="client-q",
    start_to_close_timeout=30,
    retry_policy=sv.RetryPolicy(max_attempts=3, initial_interval=0.05, max_interval=0.05),
)
def flaky_step(value: int) -> int:
    info = sv.activity_info()
    assert info is not None
    if info.attempt < 2:
        raise OrderRejected(f"attempt {info.attempt} failed")
    return value * 10


@sv.workflow(name="test.client.flaky")
def flaky(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
    return flaky_step.execute(
        ctx, data["value"], options=sv.ActivityOptions(heartbeat_timeout=20), activity_id="flaky"
    )


def arun(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine like an async view would, closing its thread's connection after."""

    async def main() -> T:
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def row_exists(instance_id: str) -> bool:
    return WorkflowInstance.objects.filter(instance_id=instance_id).exists()


# -- starting ---------------------------------------------------------------------------


def test_start_by_definition_and_by_name(worker: Any) -> None:
    by_definition = sv.start_workflow(sum3, {"a": 1, "b": 2, "c": 3})
    by_name = sv.start_workflow("test.sum3", {"a": 10, "b": 20, "c": 30})
    assert isinstance(by_definition, str) and by_definition
    assert by_definition != by_name
    assert sv.wait_workflow(by_definition, timeout=20).output == 6
    assert sv.wait_workflow(by_name, timeout=20).output == 60
    assert sv.describe(by_name).workflow_name == "test.sum3"


def test_start_with_a_custom_instance_id(worker: Any) -> None:
    instance_id = sv.start_workflow(echo, {"n": 1}, instance_id="order-1001")
    assert instance_id == "order-1001"
    result = sv.wait_workflow("order-1001", timeout=20)
    assert result == sv.WorkflowResult("order-1001", "completed", {"n": 1}, None)


def test_input_is_encoded_with_djangos_json_encoder(worker: Any) -> None:
    when = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    instance_id = sv.start_workflow(echo, {"when": when, "token": token, "none": None})
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.output == {"when": "2030-05-06T07:08:09Z", "token": str(token), "none": None}


def test_starting_by_name_needs_no_registration(tdb: None) -> None:
    instance_id = sv.start_workflow("elsewhere.only_in_another_service", [1, 2])
    description = sv.describe(instance_id)
    assert description.workflow_name == "elsewhere.only_in_another_service"
    assert description.status == sv.WorkflowStatus.RUNNING


def test_duplicate_id_is_rejected_while_running(tdb: None) -> None:
    sv.start_workflow("test.client.echo", 1, instance_id="dup")
    with pytest.raises(sv.WorkflowAlreadyStarted) as info:
        sv.start_workflow("test.client.echo", 2, instance_id="dup")
    assert info.value.instance_id == "dup"
    assert WorkflowInstance.objects.get(instance_id="dup").input == 1


def test_duplicate_id_is_rejected_after_completion(worker: Any) -> None:
    sv.start_workflow(echo, "first", instance_id="done-once")
    assert sv.wait_workflow("done-once", timeout=20).output == "first"
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflow(echo, "second", instance_id="done-once")
    assert sv.get_workflow_result("done-once").output == "first"


INVALID_IDS = ["", "x" * 256, "line\nbreak", "nul\x00byte", "tab\tid", "del\x7f", "c1\x85control"]
UNENCODABLE = [object(), float("nan"), float("inf"), {"a": float("-inf")}, {"tags": {1, 2}}, b"x"]


def test_invalid_ids_are_rejected_with_nothing_written(tdb: None) -> None:
    for instance_id in INVALID_IDS:
        with pytest.raises(sv.WorkflowStartRejected):
            sv.start_workflow("test.client.echo", None, instance_id=instance_id)
        assert WorkflowInstance.objects.count() == 0, repr(instance_id)
    with pytest.raises(sv.WorkflowStartRejected):
        sv.start_workflow("test.client.echo", None, instance_id=42)  # type: ignore[arg-type]


def test_unencodable_input_is_rejected_with_nothing_written(tdb: None) -> None:
    for bad_input in UNENCODABLE:
        with pytest.raises(sv.WorkflowStartRejected):
            sv.start_workflow("test.client.echo", bad_input, instance_id="bad-input")
        assert not row_exists("bad-input"), repr(bad_input)
    assert WorkflowInstance.objects.count() == 0


def test_start_needs_a_definition_or_a_name(tdb: None) -> None:
    for bad in ("", "   ", None, 42):
        with pytest.raises(sv.WorkflowStartRejected):
            sv.start_workflow(bad)  # type: ignore[arg-type]
    assert WorkflowInstance.objects.count() == 0


ODD_IDS = [
    "<script>alert('x')</script>",
    "../../etc/passwd",
    "a/b?c=d&e#f %20",
    "ünïcödé-注文-🧵",
    "x" * 255,
    " leading and trailing ",
]


def test_html_path_and_unicode_characters_are_allowed(tdb: None) -> None:
    for instance_id in ODD_IDS:
        assert sv.start_workflow("test.client.echo", 1, instance_id=instance_id) == instance_id
        assert sv.describe(instance_id).instance_id == instance_id
        assert sv.get_workflow_result(instance_id).status == "running"
    assert sorted(WorkflowInstance.objects.values_list("instance_id", flat=True)) == sorted(ODD_IDS)
    assert ids(sv.find_instances(instance_id="<SCRIPT>")) == ["<script>alert('x')</script>"]


def test_errors_are_selvedge_errors() -> None:
    for cls in (sv.WorkflowAlreadyStarted, sv.WorkflowStartRejected, sv.WorkflowNotFound):
        assert issubclass(cls, sv.SelvedgeError)
    assert issubclass(sv.WorkflowNotFound, LookupError)


# -- transactions -----------------------------------------------------------------------


def test_start_in_a_rolled_back_transaction_leaves_nothing(worker: Any) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        sv.start_workflow(ledger, ["rolled-back"], instance_id="rolled-back")
        assert row_exists("rolled-back")  # visible inside the transaction
        raise Abort

    assert not row_exists("rolled-back")
    with pytest.raises(sv.WorkflowNotFound):
        sv.get_workflow_result("rolled-back")

    # A later start runs normally; the rolled-back one never ran.
    sv.start_workflow(ledger, ["after"], instance_id="after")
    assert sv.wait_workflow("after", timeout=20).output == ["after"]
    assert list(Ledger.objects.values_list("entry", flat=True)) == ["after"]
    assert not row_exists("rolled-back")
    # The id was never taken: it can be used now.
    assert sv.start_workflow(echo, 1, instance_id="rolled-back") == "rolled-back"


def test_start_in_a_committed_transaction_runs_after_commit(worker: Any) -> None:
    with transaction.atomic():
        sv.start_workflow(ledger, ["committed"], instance_id="committed")
        Ledger.objects.create(entry="caller's own write")
    result = sv.wait_workflow("committed", timeout=20)
    assert result.status == "completed"
    assert result.output == ["committed"]
    assert sorted(Ledger.objects.values_list("entry", flat=True)) == [
        "caller's own write",
        "committed",
    ]


def test_duplicate_inside_a_transaction_keeps_the_callers_transaction_usable(tdb: None) -> None:
    sv.start_workflow("test.client.echo", 1, instance_id="taken")
    with transaction.atomic():
        with pytest.raises(sv.WorkflowAlreadyStarted):
            sv.start_workflow("test.client.echo", 2, instance_id="taken")
        sv.start_workflow("test.client.echo", 3, instance_id="fresh")
    assert row_exists("fresh")


# -- reading and waiting ----------------------------------------------------------------


def test_unknown_ids_raise_workflow_not_found(tdb: None) -> None:
    for call in (sv.get_workflow_result, sv.describe, sv.list_activity_tasks):
        with pytest.raises(sv.WorkflowNotFound) as info:
            call("no-such-instance")
        assert info.value.instance_id == "no-such-instance"
    with pytest.raises(LookupError):
        sv.describe("no-such-instance")
    with pytest.raises(sv.WorkflowNotFound):
        sv.wait_workflow("no-such-instance", timeout=1)


def test_describe_fields(worker: Any) -> None:
    before = timezone.now()
    instance_id = sv.start_workflow(echo, {"x": 1}, instance_id="described")
    result = sv.wait_workflow(instance_id, timeout=20)
    after = timezone.now()
    d = sv.describe(instance_id)
    assert isinstance(d, sv.WorkflowDescription)
    assert d.instance_id == "described"
    assert d.workflow_name == "test.client.echo"
    assert d.status == sv.WorkflowStatus.COMPLETED == result.status == "completed"
    assert d.cancel_requested is False
    assert d.cancel_reason == ""
    assert d.parent_instance_id == ""
    assert d.parent_key == ""
    assert d.started_at.tzinfo is not None
    assert before <= d.started_at <= d.updated_at <= after


def test_result_of_a_running_instance(tdb: None) -> None:
    instance_id = sv.start_workflow("test.client.echo", 5)
    assert sv.get_workflow_result(instance_id) == sv.WorkflowResult(instance_id, "running")


def test_wait_times_out_while_running(tdb: None) -> None:
    instance_id = sv.start_workflow("test.client.echo", 5)  # no worker runs it
    with pytest.raises(TimeoutError):
        sv.wait_workflow(instance_id, timeout=0.2)
    assert sv.get_workflow_result(instance_id).status == "running"


def test_failed_workflow_result_carries_an_application_error(worker: Any) -> None:
    instance_id = sv.start_workflow(reject, {"order": 77})
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == sv.WorkflowStatus.FAILED
    assert result.output is None
    assert isinstance(result.error, sv.ApplicationError)
    assert result.error.type == f"{__name__}.OrderRejected"
    assert result.error.message == "order 77 rejected"
    assert sv.get_workflow_result(instance_id).error.message == "order 77 rejected"  # type: ignore[union-attr]
    assert sv.describe(instance_id).status == "failed"

    declined = sv.start_workflow(reject, {"application": True})
    error = sv.wait_workflow(declined, timeout=20).error
    assert isinstance(error, sv.ApplicationError)
    assert (error.type, error.message, error.details) == (
        "PaymentDeclined",
        "card declined",
        {"code": 51},
    )


def test_oversized_input_is_rejected_with_nothing_written(tdb: None) -> None:
    with override_settings(SELVEDGE={**settings.SELVEDGE, "MAX_PAYLOAD_BYTES": 64}):
        with pytest.raises(sv.WorkflowStartRejected):
            sv.start_workflow("test.client.echo", "x" * 100, instance_id="too-big")
        assert sv.start_workflow("test.client.echo", "x" * 10, instance_id="small") == "small"
    assert not row_exists("too-big")
    assert row_exists("small")


def test_workflow_status_values() -> None:
    assert [s.value for s in sv.WorkflowStatus] == ["running", "completed", "failed", "cancelled"]
    assert sv.WorkflowStatus.RUNNING == "running"


# -- activity tasks ---------------------------------------------------------------------


def test_list_activity_tasks_in_issue_order(worker: Any) -> None:
    instance_id = sv.start_workflow(sum3, {"a": 1, "b": 2, "c": 3})
    assert sv.wait_workflow(instance_id, timeout=20).output == 6
    tasks = sv.list_activity_tasks(instance_id)
    assert [t.key for t in tasks] == ["#1:test.add", "#2:test.add", "#3:test.add"]
    assert [t.seq for t in tasks] == [1, 2, 3]
    for task in tasks:
        assert isinstance(task, sv.ActivityTaskInfo)
        assert (task.name, task.queue, task.status) == ("test.add", "", "completed")
        assert (task.attempts, task.failures, task.last_error) == (1, 0, None)
        assert task.options.retry_policy is not None
        assert task.options.retry_policy.max_attempts == 5


def test_list_activity_tasks_shows_resolved_options_and_retries(worker: Any) -> None:
    instance_id = sv.start_workflow(flaky, {"value": 4})
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.output == 40, result.error
    [task] = sv.list_activity_tasks(instance_id)
    assert task.key == "flaky"
    assert task.name == "test.client.flaky_step"
    assert task.queue == "client-q"
    assert task.status == "completed"
    assert isinstance(task.options, sv.ActivityOptions)
    assert task.options.queue == "client-q"
    assert task.options.start_to_close_timeout == 30
    assert task.options.heartbeat_timeout == 20  # per-call override
    assert task.options.retry_policy is not None
    assert task.options.retry_policy.max_attempts == 3
    assert (task.attempts, task.failures) == (2, 1)
    assert isinstance(task.last_error, sv.ApplicationError)
    assert task.last_error.type == f"{__name__}.OrderRejected"
    assert task.last_error.message == "attempt 1 failed"


def test_list_activity_tasks_of_an_instance_without_activities(tdb: None) -> None:
    instance_id = sv.start_workflow("test.client.echo", 1)
    assert sv.list_activity_tasks(instance_id) == []


# -- find_instances ---------------------------------------------------------------------


def ids(page: sv.InstancePage) -> list[str]:
    return [d.instance_id for d in page.instances]


def test_find_by_status_and_name(worker: Any) -> None:
    done = sv.start_workflow(echo, 1, instance_id="find-done")
    failed = sv.start_workflow(reject, {"order": 1}, instance_id="find-failed")
    sv.wait_workflow(done, timeout=20)
    sv.wait_workflow(failed, timeout=20)
    running = sv.start_workflow("test.client.Unregistered_Flow", 1, instance_id="find-running")

    assert ids(sv.find_instances(status="completed")) == [done]
    assert ids(sv.find_instances(status="failed")) == [failed]
    assert ids(sv.find_instances(status=sv.WorkflowStatus.RUNNING)) == [running]
    assert ids(sv.find_instances(status="cancelled")) == []
    # Partial, case-insensitive matches.
    assert ids(sv.find_instances(workflow_name="CLIENT.ECHO")) == [done]
    assert ids(sv.find_instances(workflow_name="unregistered_flow")) == [running]
    assert set(ids(sv.find_instances(workflow_name="test.client."))) == {done, failed, running}
    assert ids(sv.find_instances(instance_id="FIND-D")) == [done]
    assert set(ids(sv.find_instances(instance_id="find-"))) == {done, failed, running}
    assert ids(sv.find_instances(workflow_name="echo", status="failed")) == []
    page = sv.find_instances()
    assert all(isinstance(d, sv.WorkflowDescription) for d in page.instances)
    assert ids(page)[0] == running  # newest first
    with pytest.raises(ValueError):
        sv.find_instances(status="paused")


def test_find_by_start_time(tdb: None) -> None:
    first = sv.start_workflow("test.client.echo", 1, instance_id="t-first")
    middle = timezone.now()
    second = sv.start_workflow("test.client.echo", 2, instance_id="t-second")
    assert ids(sv.find_instances(started_after=middle)) == [second]
    assert ids(sv.find_instances(started_before=middle)) == [first]
    assert ids(sv.find_instances(started_after=middle - timedelta(hours=1))) == [second, first]
    assert ids(sv.find_instances(started_before=middle - timedelta(hours=1))) == []


INPUTS = {
    "gold": {"customer": {"id": 7, "tier": "gold", "vip": True, "note": None}, "total": 12.5},
    "silver": {"customer": {"id": 8, "tier": "silver", "vip": False, "note": "call"}, "total": 3},
    "text-id": {"customer": {"id": "7", "tier": "Gold"}, "total": 12.5},
    "one": {"customer": {"id": 1, "vip": 1, "note": 0}, "total": 0},
    "scalar": "just a string",
    "list": [1, 2, 3],
    "null": None,
}


FILTER_CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"customer.id": 7}, {"gold"}),
    ({"customer.id": "7"}, {"text-id"}),
    ({"customer.tier": "gold"}, {"gold"}),
    ({"customer.vip": True}, {"gold"}),
    ({"customer.vip": False}, {"silver"}),
    ({"customer.note": None}, {"gold"}),
    ({"customer.note": "call"}, {"silver"}),
    ({"total": 12.5}, {"gold", "text-id"}),
    ({"total": 0}, {"one"}),
    ({"total": 12.5, "customer.id": 7}, {"gold"}),
    ({"total": 12.5, "customer.id": 8}, set()),
    ({"customer.missing": 1}, set()),
    ({"customer.tier": "gold' OR '1'='1"}, set()),
]


def test_find_by_input_filters(tdb: None) -> None:
    for instance_id, data in INPUTS.items():
        sv.start_workflow("test.client.echo", data, instance_id=instance_id)
    for filters, expected in FILTER_CASES:
        assert set(ids(sv.find_instances(input_filters=filters))) == expected, filters


VALUES = {
    "int": {"v": 5},
    "float": {"v": 5.0},
    "text": {"v": "5"},
    "true": {"v": True},
    "one": {"v": 1},
    "null": {"v": None},
    "missing": {"w": 5},
    "object": {"v": {"x": 1, "y": [2, 3.0]}},
    "object-reordered": {"v": {"y": [2.0, 3], "x": 1}},
    "object-more": {"v": {"x": 1, "y": [2, 3], "z": None}},
    "list": {"v": [1, {"a": "b", "c": 2}]},
    "list-respelled": {"v": [1.0, {"c": 2, "a": "b"}]},
    "list-as-text": {"v": '[1, {"a": "b", "c": 2}]'},
    "empty-list": {"v": []},
    "empty-object": {"v": {}},
    "in-a-list": {"v": [5]},
}
VALUE_CASES: list[tuple[Any, set[str]]] = [
    # A JSON number matches by value (5 is 5.0), never a string or a boolean.
    (5, {"int", "float"}),
    (5.0, {"int", "float"}),
    ("5", {"text"}),
    (1, {"one"}),
    (True, {"true"}),
    # None matches a recorded null only: a missing key matches nothing.
    (None, {"null"}),
    # Objects and lists match as JSON values: key order and number spelling do not matter.
    ({"y": [2, 3], "x": 1}, {"object", "object-reordered"}),
    ({"x": 1}, set()),
    ([1, {"c": 2, "a": "b"}], {"list", "list-respelled"}),
    ([{"a": "b", "c": 2}, 1], set()),
    ([], {"empty-list"}),
    ({}, {"empty-object"}),
    ([5], {"in-a-list"}),
]


@pytest.mark.parametrize(("value", "expected"), VALUE_CASES, ids=lambda v: repr(v)[:40])
def test_input_filters_compare_json_values_the_same_on_both_databases(
    tdb: None, value: Any, expected: set[str]
) -> None:
    for instance_id, data in VALUES.items():
        sv.start_workflow("test.client.echo", data, instance_id=instance_id)
    assert set(ids(sv.find_instances(input_filters={"v": value}))) == expected
    # The same holds one level down, inside a list.
    for instance_id, data in VALUES.items():
        sv.start_workflow("test.client.echo", {"o": [data]}, instance_id=f"deep-{instance_id}")
    found = set(ids(sv.find_instances(input_filters={"o.0.v": value})))
    assert found == {f"deep-{i}" for i in expected}


MALFORMED_PATHS = ["a;drop", "a..b", "", ".a", "a.", "a b", "a-b", "a'b", "a[0]", "$.a", "a\nb", 5]


def test_malformed_input_filter_paths_are_value_errors(tdb: None) -> None:
    sv.start_workflow("test.client.echo", {"a": 1}, instance_id="filtered")
    for path in MALFORMED_PATHS:
        with pytest.raises(ValueError):
            sv.find_instances(input_filters={path: 1})
    with pytest.raises(ValueError):
        sv.find_instances(input_filters={"a": 1, "a;drop": 1})
    assert ids(sv.find_instances(input_filters={"a": 1})) == ["filtered"]


def test_bad_find_arguments_are_value_errors(tdb: None) -> None:
    for limit in (0, -1, 1001, 2.5, True):
        with pytest.raises(ValueError):
            sv.find_instances(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sv.find_instances(page_token="not-a-token")
    with pytest.raises(ValueError):
        sv.find_instances(input_filters={"a": object()})


def _all_pages(**kwargs: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    token = None
    while True:
        page = sv.find_instances(limit=3, page_token=token, **kwargs)
        pages.append(ids(page))
        assert page.has_more == (page.next_page_token is not None)
        if not page.has_more:
            return pages
        token = page.next_page_token
        assert len(pages) < 20, "pagination does not end"


def test_cursor_pagination_has_no_duplicates_or_gaps(tdb: None) -> None:
    started = [sv.start_workflow("test.client.page", i, instance_id=f"p{i}") for i in range(8)]
    sv.start_workflow("test.client.other", 0, instance_id="not-paged")

    pages = _all_pages(workflow_name="client.page")
    assert [len(p) for p in pages] == [3, 3, 2]
    flat = [i for p in pages for i in p]
    assert flat == list(reversed(started))  # newest first, each exactly once


def test_cursor_pagination_with_equal_start_times(tdb: None) -> None:
    for i in range(7):
        sv.start_workflow("test.client.page", i, instance_id=f"same-{i}")
    # Many instances can share a start time (bulk starts, coarse clocks).
    WorkflowInstance.objects.update(started_at=datetime(2030, 1, 1, tzinfo=UTC))
    pages = _all_pages()
    flat = [i for p in pages for i in p]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert sorted(flat) == [f"same-{i}" for i in range(7)]
    assert len(set(flat)) == 7


def test_exact_limit_has_no_next_page(tdb: None) -> None:
    for i in range(3):
        sv.start_workflow("test.client.page", i)
    page = sv.find_instances(limit=3)
    assert len(page.instances) == 3
    assert (page.has_more, page.next_page_token) == (False, None)


# -- async twins ------------------------------------------------------------------------


def test_async_client_calls(worker: Any) -> None:
    async def view() -> dict[str, Any]:
        instance_id = await sv.astart_workflow(
            sum3, {"a": 2, "b": 3, "c": 4}, instance_id="async-1"
        )
        result = await sv.await_workflow(instance_id, timeout=20)
        return {
            "id": instance_id,
            "result": result,
            "again": await sv.aget_workflow_result(instance_id),
            "description": await sv.adescribe(instance_id),
            "page": await sv.afind_instances(workflow_name="sum3"),
            "tasks": await sv.alist_activity_tasks(instance_id),
        }

    out = arun(view())
    assert out["id"] == "async-1"
    assert out["result"] == sv.WorkflowResult("async-1", "completed", 9, None)
    assert out["again"] == out["result"]
    assert out["description"].status == "completed"
    assert ids(out["page"]) == ["async-1"]
    assert [t.key for t in out["tasks"]] == ["#1:test.add", "#2:test.add", "#3:test.add"]


def test_async_errors(tdb: None) -> None:
    async def view() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        instance_id = await sv.astart_workflow("test.client.echo", 1, instance_id="async-dup")
        for call in (
            sv.astart_workflow("test.client.echo", 2, instance_id=instance_id),
            sv.astart_workflow("test.client.echo", object()),
            sv.aget_workflow_result("missing"),
            sv.adescribe("missing"),
            sv.alist_activity_tasks("missing"),
            sv.await_workflow(instance_id, timeout=0.2),
        ):
            try:
                await call
            except Exception as error:
                raised.append(type(error))
        return raised

    assert arun(view()) == [
        sv.WorkflowAlreadyStarted,
        sv.WorkflowStartRejected,
        sv.WorkflowNotFound,
        sv.WorkflowNotFound,
        sv.WorkflowNotFound,
        TimeoutError,
    ]
    assert WorkflowInstance.objects.count() == 1
