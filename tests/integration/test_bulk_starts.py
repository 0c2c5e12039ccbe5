"""Bulk starts: ``sv.start_workflows`` and ``selvedge_django.tasks.enqueue_many``.

Many instances in one transaction, one statement per batch and table: ids in
order, all or nothing (also inside the caller's ``transaction.atomic()``),
``if_exists`` honoured, every item validated before anything is written, and the
instances run like single starts under a real worker.
"""

from __future__ import annotations

import importlib.util
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from tests.conftest import wait_until
from tests.testapp.workflows.basics import sum3

pytestmark = pytest.mark.usefixtures("tdb")

HAS_TASKS = (
    importlib.util.find_spec("django.tasks") is not None
    or importlib.util.find_spec("django_tasks") is not None
)


@sv.workflow(name="test.bulk.echo")
def echo(ctx: sv.WorkflowContext, data: Any) -> Any:
    return data


def inserts(queries: CaptureQueriesContext, table: str) -> int:
    """The INSERT statements into ``table`` among ``queries``: one prepared statement run
    for many rows (``executemany``, which Django records as "N times: INSERT ...") counts
    once."""
    return sum(
        1
        for query in queries.captured_queries
        if re.sub(r"^\d+ times: ", "", query["sql"].lstrip()).upper().startswith("INSERT")
        and table in query["sql"]
    )


def test_many_starts_are_one_statement_and_run_in_order_of_ids(worker: Any) -> None:
    starts: list[Any] = [(echo, {"n": n}) for n in range(50)]
    starts.append((sum3, {"a": 1, "b": 2, "c": 3}, {"instance_id": "bulk-sum", "priority": 5}))
    starts.append(("test.bulk.echo", "by name", {"instance_id": "bulk-by-name"}))
    with CaptureQueriesContext(connections["default"]) as queries:
        ids = sv.start_workflows(starts)
    assert len(ids) == 52 and len(set(ids)) == 52
    assert ids[50:] == ["bulk-sum", "bulk-by-name"]
    assert inserts(queries, WorkflowInstance._meta.db_table) == 1
    for n, instance_id in enumerate(ids[:50]):
        result = sv.wait_workflow(instance_id, timeout=30)
        assert (result.status, result.output) == ("completed", {"n": n})
    assert sv.wait_workflow("bulk-sum", timeout=30).output == 6
    assert sv.wait_workflow("bulk-by-name", timeout=30).output == "by name"
    assert WorkflowInstance.objects.get(instance_id="bulk-sum").priority == 5


def test_a_batch_larger_than_one_statement_binds_is_split_and_still_all_or_nothing() -> None:
    # More rows than one statement may bind (over 30 values a row).
    from selvedge_django.operations import client_store

    count = client_store().bulk_starts._max_params() // 30 + 10
    taken = sv.start_workflow(echo, "first", instance_id="bulk-taken-late")
    starts: list[Any] = [(echo, n) for n in range(count)]
    starts.append((echo, "again", {"instance_id": taken}))
    with pytest.raises(sv.WorkflowAlreadyStarted) as raised:
        sv.start_workflows(starts)
    assert raised.value.args and taken in str(raised.value)
    assert WorkflowInstance.objects.count() == 1  # the earlier batches rolled back too
    with CaptureQueriesContext(connections["default"]) as queries:
        ids = sv.start_workflows(starts[:count])
    assert WorkflowInstance.objects.filter(instance_id__in=ids).count() == count
    assert inserts(queries, WorkflowInstance._meta.db_table) >= 2
    # Created in the order given: dispatch takes equal ranks in creation order.
    seqs = dict(WorkflowInstance.objects.values_list("instance_id", "created_seq"))
    assert [seqs[i] for i in ids] == sorted(seqs[i] for i in ids)


def test_inside_a_rolled_back_transaction_nothing_is_started() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ids = sv.start_workflows([(echo, n) for n in range(10)])
        assert WorkflowInstance.objects.filter(instance_id__in=ids).count() == 10
        raise RuntimeError("roll back")
    assert WorkflowInstance.objects.count() == 0


def test_a_taken_id_fails_the_whole_call_unless_it_may_be_returned() -> None:
    sv.start_workflow(echo, "old", instance_id="bulk-existing")
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflows([(echo, 1), (echo, 2, {"instance_id": "bulk-existing"})])
    assert WorkflowInstance.objects.count() == 1
    # Another workflow's id is taken even with if_exists="return".
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflows(
            [(echo, 1), (sum3, {}, {"instance_id": "bulk-existing", "if_exists": "return"})]
        )
    assert WorkflowInstance.objects.count() == 1
    ids = sv.start_workflows(
        [(echo, 1), (echo, "new", {"instance_id": "bulk-existing", "if_exists": "return"})]
    )
    assert ids[1] == "bulk-existing"
    assert WorkflowInstance.objects.count() == 2
    assert WorkflowInstance.objects.get(instance_id="bulk-existing").input == "old"


def test_a_taken_id_names_itself_and_leaves_the_callers_transaction_usable() -> None:
    """Starts that may not return a taken id insert without skipping taken ids (one look
    at the primary key each): the unique violation is still WorkflowAlreadyStarted,
    naming the id, and the caller's own writes before it still commit."""
    sv.start_workflow(echo, "old", instance_id="bulk-taken-b")
    with transaction.atomic():
        mine = sv.start_workflow(echo, "mine")
        with pytest.raises(sv.WorkflowAlreadyStarted) as raised:
            sv.start_workflows(
                [
                    (echo, 1, {"instance_id": "bulk-free-a"}),
                    (echo, 2, {"instance_id": "bulk-taken-b"}),
                ]
            )
        assert "bulk-taken-b" in str(raised.value)
        ids = sv.start_workflows([(echo, 3, {"instance_id": "bulk-free-a"})])
    assert set(WorkflowInstance.objects.values_list("instance_id", flat=True)) == {
        "bulk-taken-b",
        mine,
        *ids,
    }


def test_an_id_given_twice_is_started_once() -> None:
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflows(
            [(echo, 1, {"instance_id": "twice"}), (echo, 2, {"instance_id": "twice"})]
        )
    assert WorkflowInstance.objects.count() == 0
    ids = sv.start_workflows(
        [
            (echo, 1, {"instance_id": "twice"}),
            (echo, 2, {"instance_id": "twice", "if_exists": "return"}),
        ]
    )
    assert ids == ["twice", "twice"]
    assert WorkflowInstance.objects.get().input == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ((echo,), "each start is"),
        ("echo", "each start is"),
        ((echo, 1, {"instance": "x"}), "unknown option"),
        ((echo, 1, ["instance_id"]), "options must be a dict"),
        ((42, 1), "definition or a name"),
        ((echo, object()), "not JSON-encodable"),
        ((echo, 1, {"priority": 1000}), "priority"),
        ((echo, 1, {"if_exists": "replace"}), "if_exists"),
        ((echo, 1, {"instance_id": ""}), "start #2"),
        ((echo, 1, {"execution_timeout": -1}), "start #2"),
    ],
)
def test_a_bad_item_is_a_typed_error_naming_it_and_nothing_is_written(
    bad: Any, message: str
) -> None:
    with pytest.raises(sv.WorkflowStartRejected) as raised:
        sv.start_workflows([(echo, 0), (echo, 1), bad, (echo, 3)])
    assert message in str(raised.value)
    assert "start #2" in str(raised.value)
    assert WorkflowInstance.objects.count() == 0


def test_attributes_are_written_with_the_instances_and_found_by_them() -> None:
    from selvedge_django.models import WorkflowAttribute

    when = timezone.now().replace(microsecond=0)
    starts: list[Any] = [
        (echo, n, {"attributes": {"tenant": "acme" if n % 2 else "globex", "amount": n}})
        for n in range(20)
    ]
    starts.append(
        (
            echo,
            "typed",
            {
                "instance_id": "bulk-typed",
                "attributes": {"paid": True, "ratio": 0.5, "due": when, "gone": None},
            },
        )
    )
    starts.append((echo, "bare"))
    with CaptureQueriesContext(connections["default"]) as queries:
        ids = sv.start_workflows(starts)
    assert inserts(queries, WorkflowAttribute._meta.db_table) == 1
    acme = sv.find_instances(attributes={"tenant": "acme"}, limit=100).instances
    assert sorted(i.instance_id for i in acme) == sorted(ids[1:20:2])
    big = sv.find_instances(attributes={"amount__gte": 15}, limit=100).instances
    assert sorted(i.instance_id for i in big) == sorted(ids[15:20])
    assert sv.describe("bulk-typed").attributes == {"paid": True, "ratio": 0.5, "due": when}
    assert sv.describe(ids[-1]).attributes == {}
    both = sv.find_instances(attributes={"paid": True, "due__lte": when}, limit=10).instances
    assert [i.instance_id for i in both] == ["bulk-typed"]


def test_more_attributes_than_one_statement_binds_are_all_written() -> None:
    from selvedge_django.models import WorkflowAttribute
    from selvedge_django.operations import client_store

    per_start = 10
    count = client_store().bulk_starts._max_params() // (6 * per_start) + 5
    attributes = {f"a{n}": n for n in range(per_start)}
    with CaptureQueriesContext(connections["default"]) as queries:
        ids = sv.start_workflows([(echo, n, {"attributes": attributes}) for n in range(count)])
    # One statement run for every row on SQLite (no marks to count against the limit);
    # one array per column on PostgreSQL.
    assert inserts(queries, WorkflowAttribute._meta.db_table) == 1
    assert WorkflowAttribute.objects.count() == count * per_start
    rows = WorkflowAttribute.objects.filter(name="a9", number_value=9)
    assert sorted(rows.values_list("instance_id", flat=True)) == sorted(ids)
    found = sv.find_instances(attributes={"a9": 9, "a0__lt": 1}, limit=1000)
    assert len(found.instances) == min(count, 1000)


@pytest.mark.parametrize(
    "attributes",
    [
        {"Tenant": "acme"},
        {"tenant": "x" * 256},
        {"when": datetime(2030, 1, 1)},  # naive
        {"tenant": ["acme"]},
        ["tenant"],
    ],
)
def test_bad_attributes_are_a_value_error_naming_the_item_and_nothing_is_written(
    attributes: Any,
) -> None:
    from selvedge_django.models import WorkflowAttribute

    with pytest.raises(ValueError, match="start #1"):
        sv.start_workflows(
            [(echo, 0, {"attributes": {"tenant": "ok"}}), (echo, 1, {"attributes": attributes})]
        )
    assert WorkflowInstance.objects.count() == 0
    assert WorkflowAttribute.objects.count() == 0


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
def test_awkward_text_is_stored_exactly_as_given(prepared: bool) -> None:
    # Bound on the server or quoted by the driver (PREPARED_STATEMENTS off), the same.
    from django.conf import settings

    connections["default"].close()
    with override_settings(
        SELVEDGE={**getattr(settings, "SELVEDGE", {}), "PREPARED_STATEMENTS": prepared}
    ):
        _start_awkward_text()


def _start_awkward_text() -> None:
    awkward = 'a "quoted" \\ back\\slash, {brace} NULL\n\t é ☃ \\"'
    inputs: list[Any] = [
        {"text": awkward, awkward: [awkward, None, 1.5, True]},
        awkward,
        "NULL",
        "",
        None,
        [],
        {},
    ]
    note = awkward.replace("\n", " ").replace("\t", " ")  # no control characters
    ids = sv.start_workflows([(echo, value, {"attributes": {"note": note}}) for value in inputs])
    stored = {i.instance_id: i.input for i in WorkflowInstance.objects.filter(instance_id__in=ids)}
    assert [stored[i] for i in ids] == inputs
    assert all(sv.describe(i).attributes == {"note": note} for i in ids)
    found = sv.find_instances(attributes={"note": note}, limit=100).instances
    assert len(found) == len(inputs)


def test_inputs_are_stored_as_a_single_start_stores_them() -> None:
    # None is SQL NULL, not JSON null; a lone surrogate is taken (SQLite) or refused
    # (PostgreSQL) as it is from a single start.
    singles = [sv.start_workflow(echo, value) for value in (None, {"a": None})]
    ids = sv.start_workflows([(echo, None), (echo, {"a": None}), (echo, "x")])
    nulls = set(WorkflowInstance.objects.filter(input__isnull=True).values_list("pk", flat=True))
    assert nulls == {singles[0], ids[0]}
    odd = {"text": "a\ud800b"}
    try:
        with transaction.atomic():
            single = sv.start_workflow(echo, odd)
    except Exception as error:
        with pytest.raises(type(error)), transaction.atomic():
            sv.start_workflows([(echo, odd), (echo, "x")])
        return
    (bulk, _) = sv.start_workflows([(echo, odd), (echo, "x")])
    assert WorkflowInstance.objects.get(pk=bulk).input == odd
    assert WorkflowInstance.objects.get(pk=single).input == odd


def test_a_returned_id_gets_no_attributes_from_the_call() -> None:
    sv.start_workflow(echo, "old", instance_id="bulk-kept", attributes={"tenant": "acme"})
    ids = sv.start_workflows(
        [
            (echo, 1, {"attributes": {"tenant": "globex"}}),
            (
                echo,
                "new",
                {"instance_id": "bulk-kept", "if_exists": "return", "attributes": {"x": 1}},
            ),
            (echo, 2, {"instance_id": "bulk-twice", "attributes": {"tenant": "first"}}),
            (
                echo,
                3,
                {
                    "instance_id": "bulk-twice",
                    "if_exists": "return",
                    "attributes": {"tenant": "second", "y": 2},
                },
            ),
        ]
    )
    assert ids[1:] == ["bulk-kept", "bulk-twice", "bulk-twice"]
    assert sv.describe("bulk-kept").attributes == {"tenant": "acme"}
    assert sv.describe("bulk-twice").attributes == {"tenant": "first"}
    assert sv.describe(ids[0]).attributes == {"tenant": "globex"}
    assert sv.find_instances(attributes={"x": 1}).instances == []
    # A taken id that may not be returned rolls back the attributes of the others too.
    with pytest.raises(sv.WorkflowAlreadyStarted):
        sv.start_workflows(
            [
                (echo, 4, {"attributes": {"tenant": "rolled-back"}}),
                (echo, 5, {"instance_id": "bulk-kept"}),
            ]
        )
    assert sv.find_instances(attributes={"tenant": "rolled-back"}).instances == []


def test_an_empty_call_writes_nothing() -> None:
    with CaptureQueriesContext(connections["default"]) as queries:
        assert sv.start_workflows([]) == []
    assert len(queries.captured_queries) == 0


def test_the_async_twin_starts_the_same_way() -> None:
    from tests.integration.test_client import arun

    ids = arun(sv.astart_workflows([(echo, 1), (echo, 2, {"instance_id": "async-bulk"})]))
    assert ids[1] == "async-bulk"
    assert WorkflowInstance.objects.filter(instance_id__in=ids).count() == 2


def test_execution_timeout_and_started_hooks_follow_the_commit(worker: Any) -> None:
    seen: list[str] = []

    def started(sender: Any, instance_id: str, **kwargs: Any) -> None:
        seen.append(instance_id)

    from selvedge_django.signals import workflow_started

    workflow_started.connect(started, weak=False)
    try:
        with transaction.atomic():
            ids = sv.start_workflows(
                [(echo, 1, {"execution_timeout": 3600}), (echo, 2, {"instance_id": "hooked"})]
            )
            assert seen == []
        assert seen == ids
    finally:
        workflow_started.disconnect(started)
    timed = WorkflowInstance.objects.get(instance_id=ids[0])
    assert timed.execution_timeout_ms == 3_600_000
    assert timed.execution_deadline_ms is not None
    assert WorkflowInstance.objects.get(instance_id="hooked").execution_deadline_ms is None


def test_starts_of_one_timeout_share_the_deadline_a_single_start_gets() -> None:
    single = sv.start_workflow(echo, 0, execution_timeout=60)
    ids = sv.start_workflows([(echo, n, {"execution_timeout": 60}) for n in range(5)])
    expected = WorkflowInstance.objects.get(instance_id=single).execution_deadline_ms
    assert expected is not None
    for instance in WorkflowInstance.objects.filter(instance_id__in=ids):
        assert instance.execution_timeout_ms == 60_000
        assert instance.execution_deadline_ms is not None
        assert 0 <= instance.execution_deadline_ms - expected < 5_000


# -- django.tasks -----------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_TASKS, reason="neither django.tasks nor the django-tasks backport")
def test_many_tasks_are_one_statement_per_table_and_all_run(worker: Any) -> None:
    from selvedge_django.tasks import compat, enqueue_many
    from tests.testapp import tasks

    later = timezone.now() + timedelta(seconds=1)
    calls: list[Any] = [(tasks.add, [n, 1], {}) for n in range(30)]
    calls.append((tasks.send_email, ["a@example.com"], {"subject": "hi"}))
    calls.append((tasks.noted.using(run_after=later), ["deferred"], {}))
    with CaptureQueriesContext(connections["default"]) as queries:
        results = enqueue_many(calls)
    assert inserts(queries, WorkflowInstance._meta.db_table) == 1
    assert inserts(queries, HistoryEvent._meta.db_table) == 1
    assert inserts(queries, ActivityTask._meta.db_table) == 1
    assert [r.args for r in results] == [list(args) for _, args, _ in calls]
    for result in results:
        wait_until(lambda r=result: r.refresh() or r.is_finished, timeout=30)
        assert result.status == compat.TaskResultStatus.SUCCESSFUL, result.errors
    assert [r.return_value for r in results[:30]] == [n + 1 for n in range(30)]
    assert results[-1].started_at >= later
    assert {t.queue for t in ActivityTask.objects.filter(instance_id=results[30].id)} == {"emails"}


@pytest.mark.skipif(not HAS_TASKS, reason="neither django.tasks nor the django-tasks backport")
def test_a_bad_task_call_enqueues_none_of_them() -> None:
    from selvedge_django.tasks import compat, enqueue_many
    from tests.testapp import tasks

    with pytest.raises((TypeError, ValueError, compat.InvalidTask)):
        enqueue_many([(tasks.add, [1, 2], {}), (tasks.add, [object(), 2], {})])
    assert WorkflowInstance.objects.count() == 0
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many([(tasks.add, [1, 2], {})])
        raise RuntimeError("roll back")
    assert WorkflowInstance.objects.count() == 0


@pytest.mark.skipif(not HAS_TASKS, reason="neither django.tasks nor the django-tasks backport")
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
def test_tasks_of_several_batches_go_out_without_waiting_and_all_commit(
    monkeypatch: pytest.MonkeyPatch, prepared: bool
) -> None:
    """The calls are prepared a batch at a time while the store inserts the last: on
    PostgreSQL each batch's statements run in psycopg's pipeline mode (sent without
    waiting for the server; bound on the server or quoted by the driver alike), on
    SQLite all the batches are one insert per table."""
    from django.conf import settings

    from selvedge_django.operations import bulk

    monkeypatch.setattr(bulk, "TASK_BATCH", 3)
    connections["default"].close()
    with override_settings(
        SELVEDGE={**getattr(settings, "SELVEDGE", {}), "PREPARED_STATEMENTS": prepared}
    ):
        _enqueue_in_batches()


def _enqueue_in_batches() -> None:
    from selvedge_django.tasks import enqueue_many
    from tests.testapp import tasks

    conn = connections["default"]
    modes: list[str] = []  # psycopg's pipeline status at each INSERT (PostgreSQL)

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if conn.vendor == "postgresql" and sql.lstrip().upper().startswith("INSERT"):
            from psycopg import pq

            modes.append(pq.PipelineStatus(conn.connection.pgconn.pipeline_status).name)
        return execute(sql, params, many, context)

    calls: list[Any] = [(tasks.add, [n, 1], {}) for n in range(8)]
    with CaptureQueriesContext(conn) as queries, conn.execute_wrapper(record):
        results = enqueue_many(calls)
    ids = [result.id for result in results]
    assert set(WorkflowInstance.objects.values_list("instance_id", flat=True)) == set(ids)
    assert ActivityTask.objects.filter(instance_id__in=ids, status="queued").count() == 8
    per_table = 3 if conn.vendor == "postgresql" else 1  # batches of 3, 3 and 2
    assert inserts(queries, WorkflowInstance._meta.db_table) == per_table
    assert inserts(queries, ActivityTask._meta.db_table) == per_table
    if conn.vendor == "postgresql":
        assert modes and set(modes) == {"ON"}


def _bad_after(good: int) -> list[Any]:
    from tests.testapp import tasks

    return [*[(tasks.add, [n, 1], {}) for n in range(good)], (tasks.add, [object(), 1], {})]


@pytest.mark.skipif(not HAS_TASKS, reason="neither django.tasks nor the django-tasks backport")
def test_a_bad_task_in_a_later_batch_rolls_back_the_batches_already_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from selvedge_django.operations import bulk
    from selvedge_django.tasks import compat, enqueue_many
    from tests.testapp.models import Ledger

    monkeypatch.setattr(bulk, "TASK_BATCH", 2)
    with pytest.raises((TypeError, ValueError, compat.InvalidTask)):
        enqueue_many(_bad_after(5))
    assert WorkflowInstance.objects.count() == ActivityTask.objects.count() == 0
    # Inside the caller's transaction: that transaction stays usable and commits.
    with transaction.atomic():
        Ledger.objects.create(entry="before")
        with pytest.raises((TypeError, ValueError, compat.InvalidTask)):
            enqueue_many(_bad_after(5))
        Ledger.objects.create(entry="after")
    assert sorted(Ledger.objects.values_list("entry", flat=True)) == ["after", "before"]
    assert WorkflowInstance.objects.count() == HistoryEvent.objects.count() == 0


def _task_starts(ids: list[str]) -> list[Any]:
    from selvedge_django.operations.bulk import TaskStart

    now = timezone.now()
    return [
        TaskStart(
            {"task": "tests.testapp.tasks.add", "args": [1, 2], "kwargs": {}},
            instance_id=iid,
            priority=0,
            enqueued_at=now,
            deferred=False,
        )
        for iid in ids
    ]


@pytest.mark.skipif(not HAS_TASKS, reason="neither django.tasks nor the django-tasks backport")
@pytest.mark.parametrize("where", ["taken", "repeated"])
def test_an_id_taken_or_repeated_in_a_later_batch_names_itself_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from selvedge_django.operations import bulk
    from selvedge_django.tasks.runner import run_task, run_task_activity
    from tests.testapp.models import Ledger

    monkeypatch.setattr(bulk, "TASK_BATCH", 2)
    sv.start_workflow(echo, 1, instance_id="held")
    ids = [f"new-{n}" for n in range(5)] + ["held" if where == "taken" else "new-1"]
    with transaction.atomic():
        Ledger.objects.create(entry="before")
        with pytest.raises(sv.WorkflowAlreadyStarted) as raised:
            bulk.start_tasks(run_task, run_task_activity, _task_starts(ids))
        Ledger.objects.create(entry="after")
    assert ids[-1] in str(raised.value)
    assert list(WorkflowInstance.objects.values_list("instance_id", flat=True)) == ["held"]
    assert ActivityTask.objects.count() == 0
    assert Ledger.objects.count() == 2


@pytest.mark.skipif(not HAS_TASKS, reason="neither django.tasks nor the django-tasks backport")
def test_bulk_results_are_the_results_single_enqueues_give() -> None:
    """Every call of a bulk enqueue gets the result a single enqueue of it gives (its own
    id, normalised arguments, its own lists), whichever form its arguments take."""
    from selvedge_django.tasks import enqueue_many
    from tests.testapp import tasks

    calls: list[Any] = [
        (tasks.add, [1, 2], {}),
        (tasks.add, (3, 4), {}),  # a tuple becomes a list
        (tasks.send_email, ["a@example.com"], {"subject": "hi"}),
        (tasks.send_email, ("b@example.com",), {"subject": ("x", 1)}),  # nested: normalised
        (tasks.send_email, [b"c@example.com"], {}),  # bytes: decoded
        (tasks.add, [True, None], {}),
        (tasks.add, [1.5, "2"], {}),
    ]
    results = enqueue_many(calls)
    singles = [task.enqueue(*args, **kwargs) for task, args, kwargs in calls]
    fields = ("task", "status", "args", "kwargs", "backend", "errors", "worker_ids")
    for bulk, single in zip(results, singles, strict=True):
        assert type(bulk) is type(single)
        assert {f: getattr(bulk, f) for f in fields} == {f: getattr(single, f) for f in fields}
        assert bulk.enqueued_at is not None and bulk.started_at is None
    ids = [result.id for result in results]
    assert len(set(ids)) == len(ids)
    for result_id in ids:
        assert uuid.UUID(result_id).hex == result_id and uuid.UUID(result_id).version == 4
    assert len({id(result.errors) for result in results}) == len(results)
    assert len({id(result.worker_ids) for result in results}) == len(results)
    for result in results:
        stored = result.task.get_backend().get_result(result.id)
        assert (stored.args, stored.kwargs) == (result.args, result.kwargs)
