"""Every hand-written statement of the portable store, by name, one comment each.

Placeholders: ``{instance}``, ``{history}``, ``{task}``, ``{signal}``, ``{timer}``
and ``{schedule}`` name the tables and ``{now}`` is the database clock in Unix
milliseconds, all filled by ``Database._tables`` when the statement runs. Other
placeholders are parts a method fills with :func:`compose` (an IN list, an optional
condition). The statements only PostgreSQL or only SQLite runs live in
:mod:`.postgresql` and :mod:`.sqlite`.

Values are bound by name (``%(instance_id)s``), as a mapping the caller builds
next to the call: no list whose order must match a statement in another file.
One name is one value: a statement that needs a value twice names it twice, and
parts combined into one statement agree on the names they share (:func:`bind`
refuses two values under one name). The parts PostgreSQL chains into one statement
name their values with a prefix of their own (``fence_*``, ``row_*``, ``wake_*``,
``arrive_*``, ``claim_*``, ``close_*``, ...). ``{now}`` binds ``clock_offset`` (the
test clock's offset), which ``Database._execute`` adds. A literal ``%`` is written
``%%``. Only a fragment the ORM composes (INLINE_NEXT, as RawSQL) and the values of a
row (:class:`Sql`, named after their column when the row is written) keep ``%s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "Params",
    "Sql",
    "bind",
    "compose",
    "in_list",
    "marks",
    "not_in_list",
    "numbered",
    "positional",
]

#: The values of a :class:`Sql` expression: by name, or by position for one that a row
#: or the ORM names (:meth:`Sql.named`, :func:`positional`).
Params = Mapping[str, Any] | Sequence[Any]


class Sql:
    """A SQL expression with its parameters, for :meth:`Database._insert` values and
    conditions: bound by name, or by position (``%s``) for a value whose names the row
    gives (:meth:`named`)."""

    __slots__ = ("params", "sql")

    def __init__(self, sql: str, params: Params = ()) -> None:
        self.sql = sql
        self.params = params

    def named(self, prefix: str = "value") -> tuple[str, dict[str, Any]]:
        """The expression bound by name: its ``%s`` marks named ``prefix_0``, ... in order."""
        if isinstance(self.params, Mapping):
            return self.sql, dict(self.params)
        parts = self.sql.split("%s")
        if len(parts) - 1 != len(self.params):
            raise ValueError(f"{self.sql!r} does not have {len(self.params)} marks")
        text = parts[0] + "".join(f"%({prefix}_{i})s{part}" for i, part in enumerate(parts[1:]))
        return text, numbered(prefix, list(self.params))


def bind(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """The values of statement parts combined into one statement, by name.

    A name two parts share must carry one value (an instance id the fence and the
    history row both name); two different values under one name are a bug.
    """
    values: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if name in values and values[name] != value:
                raise ValueError(f"statement parts bind {name!r} to two values")
            values[name] = value
    return values


def positional(fragment: str) -> str:
    """``fragment`` with the clock's named mark as ``%s``, for the ORM (RawSQL, Func)."""
    return fragment.replace(CLOCK_OFFSET, "%s")


def compose(template: str, **parts: str) -> str:
    """Fill the named ``{parts}`` of ``template``, leaving the table and clock names."""
    for name, part in parts.items():
        template = template.replace("{" + name + "}", part)
    return template


def marks(count: int, name: str | None = None) -> str:
    """``count`` parameter marks: ``%(name_0)s, %(name_1)s, ...`` (:func:`numbered` binds
    them), or ``%s, %s, ...`` without a name (a statement the ORM composes)."""
    if name is None:
        return ", ".join(["%s"] * count)
    return ", ".join(f"%({name}_{i})s" for i in range(count))


def numbered(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The values of :func:`marks` with ``name``: ``{name_0: values[0], ...}``."""
    return {f"{name}_{i}": value for i, value in enumerate(values)}


def in_list(column: str, count: int, name: str | None = None) -> str:
    """`` AND column IN (...)`` for ``count`` values (:func:`marks`); empty (every row)
    for none."""
    if not count:
        return ""
    return f" AND {column} IN ({marks(count, name)})"


def not_in_list(column: str, count: int, name: str | None = None) -> str:
    """`` AND column NOT IN (...)`` for ``count`` values (:func:`marks`); empty (every
    row) for none."""
    if not count:
        return ""
    return f" AND {column} NOT IN ({marks(count, name)})"


# -- the clock -----------------------------------------------------------------------------

# The clock's one parameter: the test clock's offset in ms (0 outside tests).
CLOCK_OFFSET = "%(clock_offset)s"
# The database clock in ms on PostgreSQL: statement_timestamp() is stable within a
# statement, so comparisons with it can drive index scans (clock_timestamp() cannot).
NOW_MS_POSTGRESQL = (
    f"(CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT) + {CLOCK_OFFSET})"
)
# The database clock in ms on SQLite.
NOW_MS_SQLITE = f"(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + {CLOCK_OFFSET})"
# A clock value plus a number of milliseconds.
PLUS_MS = "({value} + %s)"
# Read the database clock.
SELECT_NOW = "SELECT {now}"

# -- generic rows --------------------------------------------------------------------------

# Insert one row of a model (Database._insert).
INSERT_ROW = "INSERT INTO {table} ({columns}) VALUES ({values})"
# Insert one row of a model only if a condition holds, in the same statement.
INSERT_ROW_IF = "INSERT INTO {table} ({columns}) SELECT {values} WHERE {condition}"
# Appended to an INSERT or UPDATE to read columns of the rows it wrote.
RETURNING = " RETURNING {columns}"
# Appended to a fence update that releases the lease: was input left for a dispatch?
RETURNING_RUNNABLE = " RETURNING runnable"

# -- fences and history rows ---------------------------------------------------------------

# The fence check: must touch exactly the writer's row (lease owner and epoch, running).
FENCE_UPDATE = (
    "UPDATE {instance} SET updated_at = %(fence_at)s{step}{release}"
    " WHERE instance_id = %(fence_instance_id)s AND lease_owner = %(fence_owner)s"
    " AND lease_epoch = %(fence_epoch)s AND status = %(fence_running)s{uncancelled}"
)
# FENCE_UPDATE part: record the command being issued.
FENCE_SET_STEP = ", current_step = %(fence_step)s"
# FENCE_UPDATE part: release the lease (an execution that suspends ends a run of errors).
FENCE_SET_RELEASE = (
    ", lease_owner = '', lease_expires_ms = NULL, execution_errors = 0, execution_error = ''"
)
# FENCE_UPDATE part after FENCE_SET_RELEASE: where the execution waits (the released
# reservation's own command), so the next lease reads its value (LEASED_PARKED_VALUE).
FENCE_SET_PARKED = ", parked_seq = %(fence_parked_seq)s, parked_key = %(fence_parked_key)s"
# FENCE_UPDATE part: only while no cancel request is recorded.
FENCE_UNCANCELLED = " AND cancel_requested = %(fence_cancelled)s"
# ctx.set_progress(): the instance's progress, fenced like FENCE_UPDATE.
SET_PROGRESS = (
    "UPDATE {instance} SET progress = %(progress)s, updated_at = %(updated_at)s"
    " WHERE instance_id = %(instance_id)s AND lease_owner = %(owner)s"
    " AND lease_epoch = %(epoch)s AND status = %(running)s"
)
# The cancel request of an instance a fence still holds (after an uncancelled fence failed).
CANCEL_REASON_UNDER_FENCE = (
    "SELECT cancel_requested, cancel_reason FROM {instance} WHERE instance_id = %(instance_id)s"
    " AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s AND status = %(running)s"
)
# The columns of a history row insert, then VALUES or a SELECT from a CTE.
_HISTORY_INSERT = (
    "INSERT INTO {history} (instance_id, key, seq, command, event_type, data,"
    " reservation, delivered_seq, created_at, arrived_at) "
)
_HISTORY_VALUES = (
    "%(row_instance_id)s, %(row_key)s, %(row_seq)s, %(row_command)s, %(row_event_type)s,"
    " %(row_data)s, %(row_reservation)s, %(row_delivered_seq)s, %(row_created_at)s, NULL"
)
# Insert one history row.
HISTORY_INSERT = _HISTORY_INSERT + f"VALUES ({_HISTORY_VALUES})"
# Insert one history row if the CTE {source} has a row (one-statement writes).
HISTORY_INSERT_FROM = _HISTORY_INSERT + f"SELECT {_HISTORY_VALUES} FROM {{source}}"

# -- becoming runnable ---------------------------------------------------------------------

# The SET terms that mark an instance runnable; one already runnable keeps its place.
WAKE_SET = (
    "ready_ms = CASE WHEN runnable THEN ready_ms ELSE {now} END, runnable = %(wake_runnable)s"
)
# Mark one instance runnable, whatever its lease (a parent re-attaching to its child).
WAKE_INSTANCE = "UPDATE {instance} SET " + WAKE_SET + " WHERE instance_id = %(wake_instance_id)s"
# Mark one running instance runnable ({condition}: a further AND ...).
WAKE_RUNNING = (
    "UPDATE {instance} SET "
    + WAKE_SET
    + " WHERE instance_id = %(wake_instance_id)s AND status = %(wake_running)s{condition}"
)

# -- instances -----------------------------------------------------------------------------

# The instance columns an execution reads, in the order InstanceHead takes them.
HEAD_COLUMNS = (
    "workflow_name, input, status, cancel_requested, cancel_reason, parent_instance_id, parent_key,"
    " parked_seq, parked_key, history_generation"
)
# A start: runnable, or leased at once to a worker of this process (epoch 1, expiring
# on the database clock). One text for both, so statement-level tools see one start. A
# taken id inserts nothing (the primary key decides, also between racing starts).
# {next_seq}: the dialect's next creation number (Database.NEXT_SEQ).
INSERT_INSTANCE = (
    "INSERT INTO {instance} (instance_id, workflow_name, status, input, output,"
    " error, lease_owner, lease_epoch, lease_expires_ms, runnable,"
    " cancel_requested, cancel_reason, parent_instance_id, parent_key,"
    " service_name, current_step, started_at, updated_at, closed_at, ready_ms, code_version,"
    " execution_timeout_ms, execution_deadline_ms, trace_context, priority, created_seq)"
    " VALUES (%(start_instance_id)s, %(start_workflow_name)s, %(start_status)s,"
    " %(start_input)s, NULL, NULL, %(start_lease_owner)s, %(start_lease_epoch)s,"
    " (CASE WHEN %(start_leased)s THEN {now} + %(start_ttl_ms)s END), %(start_runnable)s,"
    " %(start_cancel_requested)s, %(start_cancel_reason)s, %(start_parent_instance_id)s,"
    " %(start_parent_key)s, %(start_service_name)s, %(start_current_step)s,"
    " %(start_started_at)s, %(start_updated_at)s, NULL, {now}, %(start_code_version)s,"
    " %(start_timeout_ms)s, {now} + %(start_timeout_ms)s, %(start_trace_context)s,"
    " %(start_priority)s, {next_seq})"
    " ON CONFLICT (instance_id) DO NOTHING"
)
# The next creation number on PostgreSQL: a sequence (made by migration 0018).
NEXT_SEQ_POSTGRESQL = "nextval('selvedge_django_instance_seq')"
# The next creation number on SQLite, whose one writer makes it unique: the rowid the
# next row gets (the largest plus one; SQLite finds the largest without a scan).
NEXT_SEQ_SQLITE = "(SELECT COALESCE(MAX(rowid), 0) + 1 FROM {instance})"
# The workflow of an instance (an id a start found taken).
SELECT_WORKFLOW_NAME = "SELECT workflow_name FROM {instance} WHERE instance_id = %(instance_id)s"
# An instance's result, for the client API.
SELECT_RESULT = "SELECT status, output, error FROM {instance} WHERE instance_id = %(instance_id)s"
# A django.tasks record: the instance and its task by key (no task row yet: NULLs).
SELECT_TASK_RECORD = (
    "SELECT i.workflow_name, i.status, i.input, i.output, i.error, i.started_at, i.closed_at,"
    " t.status, t.attempts, t.failures, t.last_error, t.claim_owner, t.claim_started_ms"
    " FROM {instance} i LEFT JOIN {task} t ON t.instance_id = i.instance_id AND t.key = %(key)s"
    " WHERE i.instance_id = %(instance_id)s"
)
# An instance's status.
SELECT_STATUS = "SELECT status FROM {instance} WHERE instance_id = %(instance_id)s"
# What an execution reads of its instance (when it did not come with the lease).
SELECT_HEAD = f"SELECT {HEAD_COLUMNS} FROM {{instance}} WHERE instance_id = %(instance_id)s"
# Dispatch, first part: running, owned under an expired lease ({named}: the names).
DISPATCH_EXPIRED = (
    "status = 'running' AND NOT (lease_owner = '') AND lease_expires_ms < {now}{named}"
)
# Both parts of a dispatch pass over an instance another worker keeps in its workflow
# cache until its sticky window ends (the worker's own, and any other once it ended).
DISPATCH_STICKY = " AND (sticky_owner = '' OR sticky_owner = %(owner)s OR sticky_until_ms <= {now})"
# The dispatch order of ready instances, smallest first: the expression of the index
# sv_inst_rank_idx (models.PriorityRank), so the planner walks that index; equal ranks
# go in the order of creation (READY_ORDER, the index's next column).
READY_RANK = "(ready_ms - 60000 * priority)"
READY_ORDER = f"{READY_RANK}, created_seq"
# The claim order of queued tasks, smallest first (sv_task_rank_idx).
TASK_RANK = "(not_before_ms - 60000 * priority)"
# Dispatch, second part: running, unowned, runnable and ready ({named}: the names).
DISPATCH_READY = "status = 'running' AND lease_owner = '' AND runnable AND ready_ms <= {now}{named}"
# The SET of a dispatch: the lease to the owner, a new epoch, not runnable.
LEASE_SET = (
    "UPDATE {instance} SET lease_owner = %(owner)s, lease_epoch = lease_epoch + 1,"
    " lease_expires_ms = {now} + %(ttl_ms)s, runnable = %(runnable)s"
)
# Read with a lease: the value (event type, data) of the history row where the instance's
# last execution parked, NULL while none arrived (one lookup of sv_history_key_uniq each).
LEASED_PARKED_VALUE = (
    "(SELECT h.event_type FROM {history} h WHERE h.instance_id = {instance}.instance_id"
    " AND h.key = {instance}.parked_key AND h.data IS NOT NULL),"
    " (SELECT h.data FROM {history} h WHERE h.instance_id = {instance}.instance_id"
    " AND h.key = {instance}.parked_key)"
)
# Read with a lease: whether the instance has nothing for a snapshot to read (no history
# row, no delivered signal: it never ran), so its first execution reads nothing more.
# Scalar subqueries with LIMIT, not NOT EXISTS, which the planner may turn into a hashed
# subplan reading the whole table.
LEASED_HISTORY_EMPTY = (
    "(SELECT 1 FROM {history} h WHERE h.instance_id = {instance}.instance_id LIMIT 1) IS NULL"
    " AND (SELECT 1 FROM {signal} s WHERE s.instance_id = {instance}.instance_id"
    " AND s.delivered_seq IS NOT NULL AND s.archived_generation IS NULL LIMIT 1) IS NULL"
)
# Release a lease (input that arrived keeps it runnable); says whether it is runnable.
# A suspended execution also records where it parked (NULL: keep the last one), and the
# worker that keeps it cached with the end of its sticky window ('' and now: none).
RELEASE_LEASE = (
    "UPDATE {instance} SET lease_owner = '', lease_expires_ms = NULL,"
    " execution_errors = 0, execution_error = '',"
    " sticky_owner = %(sticky_owner)s, sticky_until_ms = {now} + %(sticky_ms)s,"
    " parked_seq = COALESCE(%(parked_seq)s, parked_seq),"
    " parked_key = COALESCE(%(parked_key)s, parked_key),"
    " ready_ms = CASE WHEN runnable OR NOT %(runnable)s THEN ready_ms ELSE {now} END,"
    " runnable = (runnable OR %(runnable)s) WHERE instance_id = %(instance_id)s"
    " AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s RETURNING runnable"
)
_SNAPSHOT_HISTORY = (
    "SELECT 0, id, key, seq, command, event_type, data, reservation, delivered_seq"
    " FROM {history} WHERE instance_id = %(instance_id)s"
)
_SNAPSHOT_SIGNALS = (
    " UNION ALL SELECT 1, id, channel, delivered_seq, NULL, NULL, NULL, NULL,"
    " consumed_seq FROM {signal} WHERE instance_id = %(instance_id)s AND delivered_seq IS NOT NULL"
    " AND archived_generation IS NULL"
)
# An instance's whole history and its delivered signals, in one statement.
SNAPSHOT = _SNAPSHOT_HISTORY + _SNAPSHOT_SIGNALS
# SNAPSHOT reading at most a number of history rows.
SNAPSHOT_BOUNDED = f"SELECT * FROM ({_SNAPSHOT_HISTORY} LIMIT %(limit)s) bounded{_SNAPSHOT_SIGNALS}"
# An instance's cancel request.
SELECT_CANCEL_STATE = (
    "SELECT cancel_requested, cancel_reason FROM {instance} WHERE instance_id = %(instance_id)s"
)
# The close: status, outcome, lease cleared, under the fence (one conditional update).
CLOSE_UPDATE = (
    "UPDATE {instance} SET status = %(close_status)s, output = %(close_output)s,"
    " error = %(close_error)s, error_type = %(close_error_type)s,"
    " lease_owner = '', lease_expires_ms = NULL, runnable = %(close_runnable)s, current_step = '',"
    " closed_at = %(close_at)s, updated_at = %(close_at)s"
    " WHERE instance_id = %(close_instance_id)s AND lease_owner = %(close_owner)s"
    " AND lease_epoch = %(close_epoch)s AND status = %(close_running)s"
)
# The close of an instance its start left unleased (epoch 0), without a cancel request.
CLOSE_UNLEASED = CLOSE_UPDATE + " AND cancel_requested = %(close_cancel_requested)s"
# The storage errors in a row of an instance a lease still holds.
SELECT_EXECUTION_ERRORS = (
    "SELECT execution_errors FROM {instance} WHERE instance_id = %(instance_id)s"
    " AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s AND status = %(running)s"
)
# Release a lease after a storage error, holding the instance back (fenced).
DEFER_EXECUTION = (
    "UPDATE {instance} SET lease_owner = '', lease_expires_ms = NULL, runnable = %(runnable)s,"
    " ready_ms = {now} + %(delay_ms)s, execution_errors = %(errors)s,"
    " execution_error = %(message)s, updated_at = %(updated_at)s"
    " WHERE instance_id = %(instance_id)s AND lease_owner = %(owner)s"
    " AND lease_epoch = %(epoch)s AND status = %(running)s"
)
# What terminate reads first.
SELECT_TERMINATE_HEAD = (
    "SELECT status, parent_instance_id, parent_key, workflow_name FROM {instance}"
    " WHERE instance_id = %(instance_id)s"
)
# Terminate: failed, a new lease epoch, lease cleared ({fenced}: TERMINATE_FENCED or nothing).
TERMINATE_UPDATE = (
    "UPDATE {instance} SET status = %(failed)s, output = NULL, error = %(error)s,"
    " error_type = %(error_type)s, lease_owner = '', lease_expires_ms = NULL,"
    " lease_epoch = lease_epoch + 1, runnable = %(runnable)s, closed_at = %(closed_at)s,"
    " updated_at = %(closed_at)s WHERE instance_id = %(instance_id)s"
    " AND status = %(running)s{fenced}"
)
# TERMINATE_UPDATE part: only while this execution holds the lease.
TERMINATE_FENCED = " AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s"
# TERMINATE_UPDATE part: only while the run is past its execution deadline.
TERMINATE_OVERDUE = " AND execution_deadline_ms < {now}"

# -- children ------------------------------------------------------------------------------

# An instance's parent and the parent's command key.
SELECT_PARENT = (
    "SELECT parent_instance_id, parent_key FROM {instance} WHERE instance_id = %(instance_id)s"
)
# WAKE_RUNNING part: the parent's child command still waits for an outcome, in the history
# that started the child (a continue-as-new since then opened another: its rows are not
# this child's, even under the same key).
PARENT_WAITS = (
    " AND EXISTS (SELECT 1 FROM {history} WHERE instance_id = %(parent_id)s"
    " AND key = %(parent_key)s AND command = %(parent_command)s AND data IS NULL)"
    " AND history_generation = (SELECT parent_generation FROM {instance}"
    " WHERE instance_id = %(child_id)s)"
)

# -- timers --------------------------------------------------------------------------------

# A held timer (its instance is paused) fires after the unpause.
_TIMER_DUE = "t.fired = %(fired)s AND NOT t.held AND t.fire_at_ms <= {now}"
# Whether any timer is due (the probe before a write transaction, SQLite).
TIMER_DUE_PROBE = f"SELECT 1 FROM {{timer}} t WHERE {_TIMER_DUE} LIMIT 1"
# The due timers with their instance's status and command ({lock}: the dialect's locks).
DUE_TIMERS = (
    "SELECT t.id, t.instance_id, t.key, t.expires_at, i.status, i.workflow_name,"
    " h.command"
    " FROM {timer} t JOIN {instance} i ON i.instance_id = t.instance_id"
    " LEFT JOIN {history} h ON h.instance_id = t.instance_id AND h.key = t.key"
    f" WHERE {_TIMER_DUE} ORDER BY t.fire_at_ms, t.id LIMIT %(limit)s{{lock}}"
)
# Give a history row still waiting for its value that value (an arrival).
FILL_HISTORY = (
    "UPDATE {history} SET event_type = %(event_type)s, data = %(data)s,"
    " arrived_at = %(arrived_at)s WHERE instance_id = %(instance_id)s AND key = %(key)s"
    " AND data IS NULL"
)
# Milliseconds until the next armed timer is due.
NEXT_TIMER_DUE = (
    "SELECT fire_at_ms - {now} FROM {timer} WHERE fired = %(fired)s AND NOT held"
    " ORDER BY fire_at_ms LIMIT 1"
)

# -- signals and deliveries ----------------------------------------------------------------

# A signal insert's condition: fewer pending signals than the inbox holds (bounded count).
PENDING_SIGNALS_BELOW = (
    "(SELECT COUNT(*) FROM (SELECT 1 FROM {signal} WHERE instance_id = %(inbox_instance_id)s"
    " AND consumed_seq IS NULL LIMIT %(inbox_limit)s) pending) < %(inbox_limit)s"
)
# Appended to a signal's insert: a second signal with the same idempotency key to the same
# instance inserts nothing (the conflict target is the partial unique index).
SIGNAL_KEY_CONFLICT = (
    " ON CONFLICT (instance_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
)
# The signal an idempotency key already delivered to an instance.
SIGNAL_BY_KEY = (
    "SELECT id FROM {signal} WHERE instance_id = %(instance_id)s AND idempotency_key = %(key)s"
)
# The oldest unconsumed signal of a channel.
NEXT_SIGNAL = (
    "SELECT id, channel, payload FROM {signal} WHERE instance_id = %(instance_id)s"
    " AND channel = %(channel)s AND consumed_seq IS NULL ORDER BY id LIMIT 1"
)
# Consume one signal at a history position (unless consumed already).
CONSUME_SIGNAL = (
    "UPDATE {signal} SET consumed_seq = %(seq)s, consumed_key = %(key)s"
    " WHERE id = %(signal_id)s AND instance_id = %(instance_id)s AND consumed_seq IS NULL"
)
# Mark arrived history values delivered at a position ({keys}: all, or an IN list).
DELIVER_HISTORY = (
    "UPDATE {history} SET delivered_seq = %(seq)s WHERE instance_id = %(instance_id)s"
    " AND delivered_seq IS NULL AND data IS NOT NULL AND seq IS NOT NULL"
    "{keys} RETURNING id, key"
)
# Mark signals delivered at a position ({ids}: all, or an IN list).
DELIVER_SIGNALS = (
    "UPDATE {signal} SET delivered_seq = %(seq)s WHERE instance_id = %(instance_id)s"
    " AND delivered_seq IS NULL{ids} RETURNING id, channel"
)

# -- activity tasks ------------------------------------------------------------------------

# An activity outcome arriving in the history row still waiting for it.
ARRIVE_HISTORY = (
    "UPDATE {history} SET data = %(arrive_data)s, event_type = %(arrive_event_type)s,"
    " arrived_at = %(arrive_at)s WHERE instance_id = %(arrive_instance_id)s"
    " AND key = %(arrive_key)s AND data IS NULL"
)
# WAKE_RUNNING part: unless this execution holds the lease (it reads the value itself).
NOT_HELD_BY = " AND NOT (lease_owner = %(held_owner)s AND lease_epoch = %(held_epoch)s)"
# Complete a task under a live claim (owner, epoch, unexpired on the database clock).
COMPLETE_TASK = (
    "UPDATE {task} SET status = %(complete_status)s, claim_expires_ms = NULL"
    " WHERE id = %(claim_task_id)s AND claim_owner = %(claim_owner)s"
    " AND claim_epoch = %(claim_epoch)s AND status = %(claim_running)s"
    " AND claim_expires_ms >= {now}"
)

# A queued task, every column given (a start that records its first activity);
# {source}: nothing, or a CTE the row depends on (" FROM i").
INSERT_QUEUED_TASK = (
    "INSERT INTO {task} (instance_id, workflow_name, key, seq, name, input, queue, options,"
    " max_attempts, priority, concurrency_key, max_concurrency, status, attempts, failures,"
    " not_before_ms, last_error, claim_owner, claim_epoch, claim_expires_ms, claim_started_ms,"
    " schedule_to_start_ms, start_to_close_ms, heartbeat_timeout_ms, schedule_deadline_ms,"
    " attempt_deadline_ms, heartbeat_details, created_at, updated_at)"
    " SELECT %(queued_instance_id)s, %(queued_workflow_name)s, %(queued_key)s,"
    " %(queued_seq)s, %(queued_name)s, %(queued_input)s, %(queued_queue)s, %(queued_options)s,"
    " %(queued_max_attempts)s, %(queued_priority)s, %(queued_concurrency_key)s,"
    " %(queued_max_concurrency)s, %(queued_status)s, 0, 0, {now}, NULL, '', 0, NULL, NULL,"
    " %(queued_schedule_ms)s, %(queued_start_to_close_ms)s, %(queued_heartbeat_ms)s,"
    " (CASE WHEN %(queued_has_schedule)s THEN {now} + %(queued_schedule_to_start_ms)s END),"
    " NULL, NULL,"
    " %(queued_created_at)s, %(queued_created_at)s{source}"
)

# -- claims --------------------------------------------------------------------------------
# Claim tasks no claim held before (one claim length): each row updated once.
CLAIM_FRESH = (
    "UPDATE {task} SET status = %(running)s, attempts = attempts + 1, claim_owner = %(owner)s,"
    " claim_epoch = claim_epoch + 1, claim_started_ms = {now}, schedule_deadline_ms = NULL,"
    " claim_expires_ms = {now} + %(ttl_ms)s,"
    " attempt_deadline_ms = (CASE WHEN %(has_deadline)s THEN {now} + %(deadline_ms)s END)"
    " WHERE id IN ({ids})"
)
# The rows a claim picked, whole, before it takes them (read into models: the statement
# the ORM would build, written once instead of compiled for every claim).
CLAIM_ROWS = "SELECT * FROM {task} WHERE id IN ({ids}) ORDER BY id"
# What a claim reads back of the tasks it took.
CLAIMED_BACK = (
    "SELECT id, claim_epoch, attempts, failures, claim_started_ms FROM {task}"
    " WHERE id IN ({ids}) AND claim_owner = %(owner)s"
)

_CLAIM_COLUMNS = "id, queue, concurrency_key, max_concurrency"
# The candidates of a claim, in two parts that each walk their own partial index: lapsed
# claims with retries left (sv_task_claim_idx, taken first: an attempt was interrupted),
# then due queued tasks by priority and age (sv_task_rank_idx). {names}: the activities
# served (a VALUES list); {filters}: further ANDs; {lock}: the dialect's row locks;
# {limit}: the batch size, a validated int written into the text (the planner sees it);
# {hint}: the dialect's way to name sv_task_rank_idx (SQLite prefers sv_task_queued_idx
# for the due-time range and sorts the backlog).
# The clock is read once (t) and the names bound once (n): the statement binds no more
# values than the names and the queues. The literals repeat the indexes' conditions.
CLAIM_PICK = (
    "WITH n (name) AS (VALUES {names}), t (now) AS (SELECT {now}),"
    f" e AS (SELECT {_CLAIM_COLUMNS}, 0 AS part, 0 AS since FROM {{task}}"
    " WHERE status = 'running' AND claim_expires_ms < (SELECT now FROM t)"
    " AND (max_attempts = 0 OR failures < max_attempts - 1)"
    " AND name IN (SELECT name FROM n){filters} ORDER BY claim_expires_ms LIMIT {limit}{lock}),"
    f" q AS (SELECT {_CLAIM_COLUMNS}, 1 AS part, {TASK_RANK} AS since FROM {{task}}{{hint}}"
    " WHERE status = 'queued' AND not_before_ms <= (SELECT now FROM t)"
    f" AND name IN (SELECT name FROM n){{filters}} ORDER BY {TASK_RANK}, id"
    " LIMIT {limit}{lock})"
    f" SELECT {_CLAIM_COLUMNS} FROM (SELECT * FROM e UNION ALL SELECT * FROM q) c"
    " ORDER BY part, since, id LIMIT {limit}"
)
# Whether a claim would find anything ({pick}: CLAIM_PICK for one row).
CLAIM_PROBE = "SELECT 1 FROM ({pick}) p"


def claim_names(count: int) -> str:
    """CLAIM_PICK's VALUES rows of ``count`` activity names (``name_0``, ...)."""
    return ", ".join(f"(%(name_{i})s)" for i in range(count))


# CLAIM_PICK part: only these queues ({queues}: marks).
CLAIM_QUEUES = " AND queue IN ({queues})"
# CLAIM_PICK part: not these (paused, or rate-limited and full) queues ({queues}: marks).
CLAIM_NOT_QUEUES = " AND queue NOT IN ({queues})"
# CLAIM_PICK part: not a task of a paused instance (storage.pauses holds them; they are
# not in sv_task_rank_idx). {not_held}: the dialect's spelling (Database.NOT_HELD_SQL).
CLAIM_NOT_HELD = " AND {not_held}"

# -- flow control: concurrency keys and queue rate limits ----------------------------------

# CLAIM_PICK part: no concurrency key, or fewer live attempts of its key than its
# max_concurrency (sv_task_running_key_idx; t is CLAIM_PICK's clock). The keyless test
# comes first: an OR evaluates its terms in order, so keyless rows count nothing, and the
# planner estimates the condition from the key column's statistics (nearly every row).
_KEY_ROOM = (
    "({row}.concurrency_key = '' OR (SELECT COUNT(*) FROM {task} r"
    " WHERE r.status = 'running' AND r.concurrency_key = {row}.concurrency_key"
    " AND NOT (r.concurrency_key = '') AND r.claim_expires_ms >= {clock})"
    " < {row}.max_concurrency)"
)
CONCURRENCY_ROOM = compose(_KEY_ROOM, row="{task}", clock="(SELECT now FROM t)")
# An inline claim's condition on its task ({task}, the claim's row): a lapsed claim goes
# first anyway; a queued task only when no due queued task of its queue that this worker
# serves ({names}: a further AND on c) and that has room under its key comes before it in
# claim order (TASK_RANK, then id). So an inline claim never takes a task ahead of one the
# claim statement would take first. The rank and id walk sv_task_rank_idx ({hint}); {names}
# also says "not held", as that index does.
INLINE_NEXT = (
    "({task}.status = 'running' OR NOT EXISTS (SELECT 1 FROM {task} c{hint}"
    " WHERE c.status = 'queued' AND c.not_before_ms <= {now} AND c.queue = {task}.queue"
    " AND (c.not_before_ms - 60000 * c.priority) <= _RANK_OF_TASK"
    " AND ((c.not_before_ms - 60000 * c.priority) < _RANK_OF_TASK OR c.id < {task}.id){names}"
    " AND " + compose(_KEY_ROOM, row="c", clock="{now}") + "))"
).replace("_RANK_OF_TASK", "({task}.not_before_ms - 60000 * {task}.priority)")
# The live attempts of some concurrency keys ({keys}: marks), counted after their locks.
RUNNING_BY_KEY = (
    "SELECT concurrency_key, COUNT(*) FROM {task} WHERE status = 'running'"
    " AND NOT (concurrency_key = '') AND claim_expires_ms >= {now}"
    " AND concurrency_key IN ({keys}) GROUP BY concurrency_key"
)
# A rate-limited queue's claims in its window (the last period_ms), the oldest, and now.
QUEUE_WINDOW = (
    "SELECT COUNT(*), MIN(claimed_ms), {now} FROM {queue_claim}"
    " WHERE queue = %(queue)s AND claimed_ms > {now} - %(period_ms)s"
)
# Forget a queue's claims that left its window.
QUEUE_PRUNE = (
    "DELETE FROM {queue_claim} WHERE queue = %(queue)s AND claimed_ms <= {now} - %(period_ms)s"
)
# Record the claims of rate-limited queues just taken ({ids}: marks), at the claims' own
# time: a claim counted later sees exactly the claims of the last period before it.
QUEUE_RECORD = (
    "INSERT INTO {queue_claim} (queue, claimed_ms) SELECT queue, claim_started_ms"
    " FROM {task} WHERE id IN ({ids})"
)

# -- renewals ------------------------------------------------------------------------------


def any_of(term: str, count: int) -> str:
    """``(term OR term ...)``: ``count`` copies of one parenthesised condition, the
    ``{i}`` of its names numbered 0, 1, ..."""
    return "(" + " OR ".join(compose(term, i=str(i)) for i in range(count)) + ")"


# One lease of a renewal batch (the i-th).
LEASE_MATCH = (
    "(instance_id = %(instance_{i})s AND lease_epoch = %(epoch_{i})s"
    " AND lease_owner = %(owner_{i})s)"
)
# The leases of a batch still live ({match}: any_of(LEASE_MATCH)).
LIVE_LEASES = "{match} AND lease_expires_ms >= {now} AND status = %(running)s"
# A renewed lease's expiry.
RENEW_LEASE_SET = "lease_expires_ms = {now} + %(ttl_ms)s"
# One claim of a renewal batch (the i-th).
CLAIM_MATCH = "(id = %(task_{i})s AND claim_epoch = %(epoch_{i})s AND claim_owner = %(owner_{i})s)"
# The claims of a batch still live ({match}: any_of(CLAIM_MATCH)).
LIVE_CLAIMS = "{match} AND claim_expires_ms >= {now} AND status = %(running)s"


def renew_claim_set(count: int) -> str:
    """A renewed claim's expiry: now plus its TTL (a CASE over ``count`` task ids, those
    CLAIM_MATCH names), never past the attempt's deadline (NULL < x is not true: no
    deadline, the full TTL)."""
    ttl = (
        "CASE id"
        + "".join(f" WHEN %(task_{i})s THEN CAST(%(ttl_ms_{i})s AS BIGINT)" for i in range(count))
        + " END"
    )
    expires = f"({{now}} + {ttl})"
    return (
        f"claim_expires_ms = CASE WHEN attempt_deadline_ms < {expires}"
        f" THEN attempt_deadline_ms ELSE {expires} END"
    )


def renew_details_set(count: int) -> str:
    """The heartbeat details a renewal stores: a CASE over ``count`` task ids with new
    details (``detailed_{j}``, ``details_{j}``), the other rows of the batch keep theirs."""
    cases = "".join(f" WHEN %(detailed_{j})s THEN %(details_{j})s" for j in range(count))
    return f", heartbeat_details = CASE id{cases} ELSE heartbeat_details END"


# -- schedules -----------------------------------------------------------------------------

# Whether the leader has anything to do: a slot due, or a held-back slot whose last run closed.
SCHEDULES_DUE_PROBE = (
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM {schedule} WHERE paused = %(paused)s"
    " AND next_due_ms <= {now}) OR EXISTS (SELECT 1 FROM {schedule} s WHERE s.paused = %(paused)s"
    " AND s.buffered_slot_ms IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {instance} i"
    " WHERE i.instance_id = s.last_run_id AND i.status = %(running)s))"
)
# Start runs ({columns}, {rows}): rows whose id already exists are left alone.
START_RUNS = "INSERT INTO {instance} ({columns}) VALUES {rows} ON CONFLICT (instance_id) DO NOTHING"
# Appended to START_RUNS: the ids it inserted.
RETURNING_INSTANCE_ID = " RETURNING instance_id"
# The statuses of the schedules' last runs ({ids}: marks).
RUN_STATUSES = "SELECT instance_id, status FROM {instance} WHERE instance_id IN ({ids})"
# cancel_other: request cancellation of the last run (keeping an earlier request's
# reason) and wake it, as sv.cancel_workflow does.
CANCEL_RUN = (
    "UPDATE {instance} SET cancel_requested = %(cancel_requested)s,"
    " cancel_reason = CASE WHEN cancel_requested THEN cancel_reason ELSE %(reason)s END, "
    + WAKE_SET
    + " WHERE instance_id = %(instance_id)s AND status = %(running)s"
)
# The bookkeeping of one schedule after a plan or a start, under its version.
RECORD_SCHEDULE = (
    "UPDATE {schedule} SET next_slot_ms = %(next_slot_ms)s, next_due_ms = %(next_due_ms)s,"
    " buffered_slot_ms = %(buffered_slot_ms)s, last_run_id = %(last_run_id)s,"
    " last_run_ms = %(last_run_ms)s, recent_runs = %(recent_runs)s,"
    " runs_started = runs_started + %(new_runs)s, missed_runs = missed_runs + %(missed)s,"
    " overlap_skipped_runs = overlap_skipped_runs + %(overlap_skipped)s,"
    " last_error = %(last_error)s, version = version + 1, updated_at = %(updated_at)s"
    " WHERE name = %(name)s AND version = %(version)s"
)
# The dispatch condition of COMPATIBLE_VERSIONS ({versions}: marks; {unversioned}: the
# NULL part or nothing). code_version is a column of both dispatch indexes.
VERSIONS_IN = " AND (code_version IN ({versions}){unversioned})"
VERSIONS_NULL = " AND (code_version IS NULL)"

# -- the status report (storage/status_reads.py) ------------------------------------------
# Each repeats its partial index's condition as literals, so that both databases can use
# the index; {hint} is the dialect's way to insist on it (SQLite: INDEXED BY), {runnable}
# its spelling of "runnable is true".
STATUS_COLUMNS = (
    "instance_id, workflow_name, lease_owner, lease_expires_ms, ready_ms, lease_epoch,"
    " parked_seq, execution_errors, execution_error, generation"
)
# Runnable and ready by a time (ms), the longest waiting first (sv_inst_ready_idx).
STATUS_READY = (
    f"SELECT {STATUS_COLUMNS} FROM {{instance}}{{hint}} WHERE status = 'running'"
    " AND lease_owner = '' AND {runnable} AND ready_ms <= %(by_ms)s ORDER BY ready_ms"
    " LIMIT %(limit)s"
)
# How many are runnable and ready by a time, up to a limit (sv_inst_ready_idx).
STATUS_READY_COUNT = (
    "SELECT COUNT(*) FROM (SELECT 1 FROM {instance}{hint} WHERE status = 'running'"
    " AND lease_owner = '' AND {runnable} AND ready_ms <= %(by_ms)s LIMIT %(limit)s) counted"
)
# Leased, with a lease that expires before a time, the earliest first (sv_inst_lease_idx).
STATUS_LEASED = (
    f"SELECT {STATUS_COLUMNS} FROM {{instance}}{{hint}} WHERE status = 'running'"
    " AND NOT (lease_owner = '') AND lease_expires_ms < %(before_ms)s"
    " ORDER BY lease_expires_ms LIMIT %(limit)s"
)
# Running, suspended past a command position, the longest first; {floor} is the
# condition of sv_inst_long_history_idx when the threshold allows it.
STATUS_LONG_HISTORY = (
    f"SELECT {STATUS_COLUMNS} FROM {{instance}}{{hint}} WHERE status = 'running'{{floor}}"
    " AND parked_seq > %(threshold)s ORDER BY parked_seq DESC LIMIT %(limit)s"
)
# Running and held back after storage errors, the most first (sv_inst_exec_errors_idx).
STATUS_EXECUTION_ERRORS = (
    f"SELECT {STATUS_COLUMNS} FROM {{instance}}{{hint}} WHERE status = 'running'"
    " AND execution_errors > 0 ORDER BY execution_errors DESC LIMIT %(limit)s"
)

# -- streams (storage/streams.py) ---------------------------------------------------------

# How many entries an instance's streams hold, and whether stream %s is closed.
STREAM_STATE = (
    "SELECT COALESCE(SUM(last_seq), 0), COALESCE(MAX(CASE WHEN key = %s AND closed THEN 1"
    " ELSE 0 END), 0) FROM {stream} WHERE instance_id = %s"
)
# Take a stream's next seq (creating the stream at 1) unless it is closed: the row lock
# this takes orders the stream's writers, so its entries commit in seq order.
STREAM_NEXT_SEQ = (
    "INSERT INTO {stream} (instance_id, key, last_seq, closed, updated_at)"
    " VALUES (%s, %s, 1, %s, %s) ON CONFLICT (instance_id, key) DO UPDATE"
    " SET last_seq = {stream}.last_seq + 1, updated_at = excluded.updated_at"
    " WHERE NOT {stream}.closed RETURNING last_seq"
)
# Close a stream (creating it closed when nothing was written to it).
STREAM_CLOSE = (
    "INSERT INTO {stream} (instance_id, key, last_seq, closed, updated_at)"
    " VALUES (%s, %s, 0, %s, %s) ON CONFLICT (instance_id, key) DO UPDATE"
    " SET closed = excluded.closed, updated_at = excluded.updated_at"
)
# One entry of a stream.
STREAM_ENTRY_INSERT = (
    "INSERT INTO {stream_entry} (instance_id, key, seq, value, attempt, activity_id,"
    " written_at) VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
# An activity attempt's write: the attempt still holds its claim on a running instance
# ({lock}: the dialect's shared row lock, which a close cancelling the task waits for).
STREAM_CLAIM_HELD = (
    "SELECT 1 FROM {task} WHERE id = %s AND claim_owner = %s AND claim_epoch = %s"
    " AND status = %s{lock}"
)
