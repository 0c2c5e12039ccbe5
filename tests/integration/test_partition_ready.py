"""The schema and the hot statements stay ready for partitioning by ``instance_id``.

docs/scaling.md's last levers are hash partitioning of the history and task tables
and then Citus with ``instance_id`` as the distribution column. Both need two things
of the engine, checked here on every run:

* every hot statement finds its rows by instance (``instance_id = ...``, an ``IN`` or
  ``ANY`` over a batch of instances, a join on ``instance_id``) or by queue (a queue
  name, a concurrency key, or the bounded head of one of the queue indexes that
  dispatch, claims, timers and the leader's sweeps walk);
* every hot table carries ``instance_id`` in its keys: the column, an index that
  leads with it, and ``instance_id`` in every unique key (PostgreSQL refuses a unique
  key on a partitioned table that leaves the partition key out).

The hot paths run for real (start, bulk start, dispatch, an inline step, a background
step through the activity loop, a signal, a timer, the close, child workflows and a
continue-as-new, a claim under a queue rate limit and a concurrency key, a
``django.tasks`` task claimed and completed, a stream, renewals, the leader's sweeps and
``prune``), driven step by step with a controllable clock, and every statement they send
is read by ``tests/partition_keys.py``. What does not hold today is listed in ``KNOWN``
and ``KNOWN_KEYS`` with why, and docs/scaling.md names it as the first step before
partitioning; an entry that no longer occurs fails too, so the lists only shrink.

The hot tables are the ones written or read for every workflow step: the instance,
its history, its activity tasks, signals, timers, streams and search attributes, and
the archive a resume writes. The queue-claim table of rate-limited queues is per
queue. The rest (schedules, system locks, worker heartbeats, paused queues) hold a
row per schedule, lock, worker or queue, not per instance, and stay unpartitioned.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import UniqueConstraint
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.engine.codec import Codec
from selvedge_django.engine.events import Fence
from selvedge_django.engine.ports import TaskClaim
from selvedge_django.models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    QueueClaim,
    SignalMessage,
    TimerSubscription,
    WorkflowAttribute,
    WorkflowInstance,
    WorkflowStream,
    WorkflowStreamEntry,
)
from selvedge_django.operations.prune import prune
from selvedge_django.storage import store_for
from selvedge_django.testing import ControllableClock, run_until_idle
from selvedge_django.testing.faults import FaultInjector, Statement
from selvedge_django.worker import Worker
from tests.partition_keys import Access, accesses

HOT_MODELS = [
    WorkflowInstance,
    HistoryEvent,
    ArchivedHistoryEvent,
    ActivityTask,
    SignalMessage,
    TimerSubscription,
    WorkflowStream,
    WorkflowStreamEntry,
    WorkflowAttribute,
]
HOT = {model._meta.db_table for model in HOT_MODELS}
# Rows per queue (a rate-limited queue's claims in its window): addressed by queue.
PER_QUEUE = {QueueClaim._meta.db_table}

INSTANCE = WorkflowInstance._meta.db_table
TASK = ActivityTask._meta.db_table
TIMER = TimerSubscription._meta.db_table

# The store operations that read the head of a queue index, and the tables they walk:
# a bounded read (LIMIT, or EXISTS) with no instance in it. Under hash partitioning each
# is a merge of every partition's index head; under Citus each is a query of every shard
# (docs/scaling.md: "What Citus needs first").
QUEUE_READERS: dict[str, set[str]] = {
    "lease_batch": {INSTANCE},  # ready instances (sv_inst_rank_idx), expired leases
    "claim_tasks": {TASK},  # queued tasks (sv_task_rank_idx), lapsed claims
    "fire_due_timers": {TIMER},  # due timers (sv_timer_fire_idx)
    "next_timer_due_ms": {TIMER},
    "sweep_activity_timeouts": {TASK},  # lapsed claims, schedule-to-start deadlines
    "sweep_execution_timeouts": {INSTANCE},  # execution deadlines (sv_inst_deadline_idx)
    "prune_closed": {INSTANCE},  # the oldest closed (sv_inst_closed_idx)
}

ALL = frozenset({"postgresql", "sqlite"})
PG = frozenset({"postgresql"})

# (store operation, table, kind) -> (the databases where it occurs, why, what removes it).
# "id": the row found by its surrogate id alone. One row, but a table partitioned by
# instance_id looks for it in every partition, and Citus sends it to every shard.
# Each is docs/scaling.md's first step before partitioning ("Before partitioning").
_TASK_BY_ID = (
    "COMPLETE_TASK finds the task by its id under the claim token (owner, epoch): add"
    " instance_id = the claim's (TaskClaim.instance_id holds it)"
)
KNOWN: dict[tuple[str, str, str], tuple[frozenset[str], str]] = {
    ("claim_tasks", TASK, "id"): (
        ALL,
        "the claim updates the candidates it picked (CLAIM_FRESH) and reads them back"
        " (CLAIMED_BACK, the full rows) by task id: the pick can return instance_id too,"
        " and each statement then names (instance_id, id)",
    ),
    ("complete_task", TASK, "id"): (ALL, _TASK_BY_ID),
    ("complete_closing", TASK, "id"): (ALL, _TASK_BY_ID),
    ("close", TASK, "id"): (ALL, _TASK_BY_ID + " (an inline result carried by the close)"),
    ("reserve_activity", TASK, "id"): (
        ALL,
        _TASK_BY_ID + " (an inline result carried by the next reservation)",
    ),
    ("renew_claims", TASK, "id"): (
        ALL,
        "CLAIM_MATCH names each claim by task id, owner and epoch: add its instance_id",
    ),
    ("fire_due_timers", TIMER, "id"): (
        ALL,
        "the fired timers are deleted by id: the due-timer read returned their instance"
        " ids, which the delete can name too",
    ),
    ("close", INSTANCE, "parent"): (
        ALL,
        "a close cancels its running children, found by parent_instance_id (sv_inst_parent_idx):"
        " the parent's history holds each child's id in its child command's row, so the"
        " close can name them by instance_id",
    ),
    ("continue_as_new", INSTANCE, "parent"): (
        ALL,
        "the same lookup of the children, when a continue-as-new closes the generation",
    ),
    ("start_child", INSTANCE, "scan"): (
        frozenset({"sqlite"}),
        "a child's creation number on SQLite: MAX(rowid) + 1, as create_instance",
    ),
    ("create_instance", INSTANCE, "scan"): (
        frozenset({"sqlite"}),
        "SQLite's creation number is MAX(rowid) + 1, read from the end of the rowid tree"
        " (no scan); PostgreSQL takes it from a sequence. SQLite is never partitioned",
    ),
    ("create_instances", INSTANCE, "scan"): (
        frozenset({"sqlite"}),
        "the same MAX(rowid) for a bulk start on SQLite",
    ),
}

_SURROGATE = (
    "primary key (id), a surrogate nothing references: the partitioning migration makes it"
    " (instance_id, id)"
)
# Tables whose unique keys leave instance_id out: table -> why.
KNOWN_KEYS: dict[str, str] = {
    HistoryEvent._meta.db_table: _SURROGATE + "; (instance_id, key) is already unique",
    ArchivedHistoryEvent._meta.db_table: _SURROGATE
    + "; (instance_id, generation, key) is already unique",
    ActivityTask._meta.db_table: _SURROGATE + "; (instance_id, key) is already unique",
    SignalMessage._meta.db_table: _SURROGATE
    + "; the only unique key through instance_id is the partial (instance_id,"
    " idempotency_key), so (instance_id, id) becomes the signal's key",
    TimerSubscription._meta.db_table: _SURROGATE + "; (instance_id, key) is already unique",
    WorkflowStream._meta.db_table: _SURROGATE + "; (instance_id, key) is already unique",
    WorkflowStreamEntry._meta.db_table: _SURROGATE + "; (instance_id, key, seq) is already unique",
    WorkflowAttribute._meta.db_table: _SURROGATE + "; (instance_id, name) is already unique",
}


# -- the workloads ------------------------------------------------------------------------


def drive(clock: ControllableClock, **overrides: Any) -> int:
    """Run a fresh, unstarted Worker until nothing is runnable (the loops and the sweeps)."""
    return run_until_idle(Worker(clock=clock, **overrides))


def run_hot_paths(clock: ControllableClock) -> dict[str, str]:
    """Run every hot path once; return the instance ids, by workload, for the checks."""
    ids: dict[str, str] = {}
    ids["inline"] = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    ids["bulk"] = sv.start_workflows([("test.sum3", {"a": 2, "b": 3, "c": 4})])[0]
    drive(clock)

    ids["background"] = sv.start_workflow(
        "act.run", {"activity": "act.step", "input": {"tag": "bg"}, "background": True}
    )
    drive(clock, activity_queues=[])  # reserved; nobody here serves its queue
    drive(clock)  # the activity loop claims and completes it; the close follows

    ids["signal"] = sv.start_workflow("wait.receive", {"channels": ["go"]})
    drive(clock)
    sv.signal(ids["signal"], "go", 1)
    drive(clock)

    ids["timer"] = sv.start_workflow("wait.sleep", {"seconds": 60, "form": "sleep"})
    drive(clock)
    clock.advance(timedelta(seconds=120))
    drive(clock)

    # A child per generation, and a continue-as-new between them (it archives the history).
    ids["children"] = sv.start_workflow("can.children", 1)
    drive(clock)

    ids["stream"] = sv.start_workflow("test.streams.steps", 2)
    drive(clock)
    sv.signal(ids["stream"], "go")
    drive(clock)

    # Flow control: a rate-limited queue and a concurrency key (claimed by the activity
    # loop, never inline: their counts are the claim's).
    limits = {**settings.SELVEDGE, "QUEUE_RATE_LIMITS": {"rl": "100/s"}}
    with override_settings(SELVEDGE=limits):
        options = {"queue": "rl", "concurrency_key": "customer-1", "max_concurrency": 1}
        ids["limited"] = sv.start_workflow("flow.run", {"tag": "rl", "options": options})
        drive(clock)

    if tasks_available():
        from tests.testapp import tasks

        result = tasks.add.enqueue(2, 3)
        drive(clock)
        ids["task"] = result.id

    # The renewer's two statements, over a lease and a claim (live or not: the
    # statement is the same).
    store = store_for("default", Codec())
    store.renewals.renew_leases([Fence(ids["signal"], "renewer", 1)], 30)
    task = ActivityTask.objects.filter(instance_id=ids["background"]).first()
    assert task is not None
    claim = TaskClaim(task.id, task.instance_id, task.key, "renewer", 1)
    store.renewals.renew_claims([(claim, 30.0)], {claim: "{}"})

    worker = Worker(clock=clock)
    worker.leader.run_once()  # the leader's lock, its sweeps and the schedules' check
    worker.leader.resign()

    prune(timedelta(0))  # retention: every closed instance, in batches
    return ids


def tasks_available() -> bool:
    return (
        importlib.util.find_spec("django.tasks") is not None
        or importlib.util.find_spec("django_tasks") is not None
    )


# -- the check ------------------------------------------------------------------------------


def verdicts(statements: list[Statement]) -> Iterator[tuple[Statement, Access]]:
    """Each reference to a hot or per-queue table in ``statements``, with its access."""
    for statement in statements:
        for access in accesses(statement.sql, HOT | PER_QUEUE):
            yield statement, access


def allowed(statement: Statement, access: Access) -> bool:
    """Whether ``access`` touches one instance, or one queue, as the plan needs."""
    if access.table in PER_QUEUE:
        return access.kind == "queue"
    if access.kind in ("instance", "queue"):
        return True
    if access.kind == "head":
        return access.table in QUEUE_READERS.get(statement.operation or "", set())
    return False


def violations(
    statements: list[Statement], vendor: str
) -> tuple[list[str], set[tuple[str, str, str]]]:
    """The accesses that are neither allowed nor known (as readable lines), and the
    KNOWN entries met."""
    bad: list[str] = []
    met: set[tuple[str, str, str]] = set()
    for statement, access in verdicts(statements):
        if allowed(statement, access):
            continue
        entry = (statement.operation or "(outside the store)", access.table, access.kind)
        known = KNOWN.get(entry)
        if known is not None and vendor in known[0]:
            met.add(entry)
            continue
        bad.append(f"{entry}: {access.alias} by [{access.clause[:160]}] in {statement.sql[:300]}")
    return sorted(set(bad)), met


@pytest.fixture
def traced(tdb: None, selvedge_clock: ControllableClock) -> Iterator[list[Statement]]:
    """Every statement of the hot paths, from every thread and connection."""
    with FaultInjector(trace=True) as injector:
        ids = run_hot_paths(selvedge_clock)
        statements = list(injector.statements)
    for workload, instance_id in ids.items():
        if workload != "task":  # pruned with the rest; its result was read before
            assert not WorkflowInstance.objects.filter(instance_id=instance_id).exists()
    yield statements


def test_every_hot_statement_touches_one_instance_or_one_queue(
    traced: list[Statement],
) -> None:
    vendor = connection.vendor
    bad, met = violations(traced, vendor)
    assert bad == [], "statements that address rows across instances:\n" + "\n".join(bad)
    stale = {entry for entry, (vendors, _) in KNOWN.items() if vendor in vendors} - met
    assert stale == set(), f"KNOWN entries that no longer occur (remove them): {stale}"
    # The run did reach every hot table it is meant to exercise.
    reached = {access.table for _, access in verdicts(traced)}
    assert reached >= HOT | PER_QUEUE


# -- the schema -------------------------------------------------------------------------------


def constraints(table: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, table)


@pytest.mark.parametrize("model", HOT_MODELS, ids=lambda m: m.__name__)
def test_every_hot_table_carries_instance_id_in_its_keys(tdb: None, model: Any) -> None:
    table = model._meta.db_table
    found = constraints(table)
    columns = {c.column for c in model._meta.concrete_fields}
    assert "instance_id" in columns

    # Its reads by instance are index scans: some index leads with instance_id.
    keys = [c for c in found.values() if c["index"] or c["unique"] or c["primary_key"]]
    leading = [c["columns"][0] for c in keys if c["columns"]]
    assert "instance_id" in leading, f"{table}: no index leads with instance_id"

    # A partitioned table needs instance_id in every unique key, its primary key included.
    unique = {name: c["columns"] for name, c in found.items() if c["unique"] or c["primary_key"]}
    without = {name: cols for name, cols in unique.items() if "instance_id" not in cols}
    if table in KNOWN_KEYS:
        assert without, f"{table} is in KNOWN_KEYS but all its unique keys hold instance_id"
    else:
        assert without == {}, f"{table}: unique keys without instance_id: {without}"

    # And a whole (not partial) unique key through instance_id names each of its rows.
    natural = [
        c
        for c in model._meta.constraints
        if isinstance(c, UniqueConstraint) and c.condition is None and "instance" in c.fields
    ]
    if table != INSTANCE:
        assert natural or table in KNOWN_KEYS, f"{table}: no unique key through instance_id"


# -- the checker can fail -----------------------------------------------------------------------


def statement(sql: str, operation: str = "example") -> Statement:
    return Statement(operation, None, 1, 1, sql, "", "main")


@pytest.mark.parametrize(
    "sql",
    [
        # A read of every instance's history: nothing keys it.
        f"SELECT id, data FROM {HistoryEvent._meta.db_table} WHERE data IS NULL",
        # A write of every running instance.
        f"UPDATE {INSTANCE} SET runnable = true WHERE status = 'running'",
        # An OR whose second branch names no instance.
        f"DELETE FROM {TIMER} WHERE instance_id = %(a)s OR fired",
        # A subquery over the running set, outside any queue reader.
        f"SELECT 1 FROM {INSTANCE} i WHERE NOT (i.parent_instance_id IN"
        f" (SELECT U0.instance_id FROM {INSTANCE} U0 WHERE U0.status = 'running'))",
        # A bounded read of a hot table by an operation that reads no queue.
        f"SELECT instance_id FROM {INSTANCE} WHERE runnable ORDER BY ready_ms LIMIT 10",
        # The children of an instance: rows of other instances, in every partition.
        f"SELECT instance_id FROM {INSTANCE} WHERE parent_instance_id = %(parent)s",
        # A row found by its surrogate id alone.
        f"UPDATE {TASK} SET status = 'completed' WHERE id = %(task)s",
        # An insert that does not say which instance its row belongs to.
        f"INSERT INTO {HistoryEvent._meta.db_table} (key, seq) VALUES (%s, %s)",
    ],
)
def test_the_check_rejects_statements_across_instances(sql: str) -> None:
    bad, _ = violations([statement(sql)], "postgresql")
    assert bad != []


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT id FROM {HistoryEvent._meta.db_table} WHERE instance_id = %(id)s AND data IS NULL",
        f"UPDATE {INSTANCE} SET runnable = true WHERE instance_id IN (%(a)s, %(b)s)",
        f"UPDATE {INSTANCE} SET runnable = true WHERE instance_id = ANY(%(ids)s)",
        f"DELETE FROM {TIMER} WHERE (instance_id = %(a)s AND key = %(k)s) OR"
        f" (instance_id = %(b)s AND key = %(k)s)",
        f"SELECT t.id FROM {TIMER} t JOIN {INSTANCE} i ON i.instance_id = t.instance_id"
        f" WHERE t.instance_id = %(a)s",
        f"SELECT COUNT(*) FROM {TASK} WHERE queue = %(q)s AND status = 'queued'",
        f"INSERT INTO {HistoryEvent._meta.db_table} (instance_id, key) VALUES (%s, %s)",
    ],
)
def test_the_check_accepts_statements_keyed_by_instance_or_queue(sql: str) -> None:
    assert violations([statement(sql)], "postgresql") == ([], set())


def test_a_queue_head_is_accepted_only_from_its_reader() -> None:
    head = f"SELECT instance_id FROM {INSTANCE} WHERE runnable ORDER BY ready_ms LIMIT 10"
    assert violations([statement(head, "lease_batch")], "postgresql") == ([], set())
    assert violations([statement(head, "claim_tasks")], "postgresql")[0] != []
