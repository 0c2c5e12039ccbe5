"""The statements only the PostgreSQL store runs (:mod:`.store`, :mod:`.inbox`).

Module-level text only: the store composes them with the portable parts of
:mod:`selvedge_django.storage.sql` (table names, fence updates, history inserts).
"""

from __future__ import annotations

from .. import sql

__all__ = [
    "APPEND_SIGNAL",
    "APPEND_SIGNAL_WAKE",
    "CLOSE",
    "CLOSE_WITH_INLINE",
    "COMPLETE_CLOSING",
    "COMPLETE_TASK",
    "DUE_TIMERS_LOCK",
    "IDLE_TIMEOUT_SETTING",
    "KEY_LOCK_CLASS",
    "LEASE_BATCH",
    "LOCK_INSTANCE",
    "LOCK_LIMITS",
    "LOCK_TASK",
    "NOTIFY_ALL",
    "NOTIFY_CALL",
    "NOTIFY_FROM",
    "NOT_HELD_BY_LOCKED",
    "QUEUE_LOCK_CLASS",
    "RECEIVE_NEXT",
    "RENEW_BATCH",
    "RESERVE_ACTIVITY",
    "RESERVE_WITH_INLINE",
    "SET_IDLE_TIMEOUT",
    "SHOW_AUTOVACUUM",
    "SNAPSHOT_ISOLATION",
    "START_WITH_ATTRIBUTES",
    "START_WITH_TASK",
    "STREAM_WRITE_LIVE",
    "WAKE_NOTIFYING",
]

# One consistent read of several statements.
SNAPSHOT_ISOLATION = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"
# The session's idle-in-transaction timeout (read once per connection).
IDLE_TIMEOUT_SETTING = "SELECT setting FROM pg_settings WHERE name = %(name)s"
# Raise (or turn off) the idle-in-transaction timeout for the current transaction.
SET_IDLE_TIMEOUT = "SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)"
# One NOTIFY call ({name}: the call's own names); NOTIFY_ALL sends {calls} unless the
# notification queue is too full.
NOTIFY_CALL = "pg_notify(%({name}_channel)s, %({name}_payload)s)"
NOTIFY_ALL = "SELECT {calls} WHERE pg_notification_queue_usage() < %(notify_ceiling)s"
# A scalar subquery sending {calls} once if the CTE {source} has a row.
NOTIFY_FROM = (
    "(SELECT count(*) FROM (SELECT {calls} FROM {source}"
    " WHERE pg_notification_queue_usage() < %({source}_ceiling)s LIMIT 1) n)"
)
# Lock an instance row the way a fence update does ({skip}: SKIP LOCKED or nothing).
LOCK_INSTANCE = (
    "SELECT 1 FROM {instance} WHERE instance_id = %(instance_id)s FOR NO KEY UPDATE{skip}"
)
# Lock a task row unless another transaction holds it.
LOCK_TASK = "SELECT 1 FROM {task} WHERE id = %(task_id)s FOR NO KEY UPDATE SKIP LOCKED"
# Dispatch in one statement: each part locks what it picks, skipping held rows.
LEASE_BATCH = (
    "WITH e AS (SELECT instance_id FROM {instance} WHERE {expired}"
    " ORDER BY lease_expires_ms LIMIT %(limit)s FOR UPDATE SKIP LOCKED),"
    f" r AS (SELECT instance_id, {sql.READY_RANK} AS since, created_seq AS seq FROM {{instance}}"
    f" WHERE {{ready}} ORDER BY {sql.READY_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED),"
    " c AS (SELECT instance_id FROM (SELECT instance_id, 0 AS part, 0 AS since, 0 AS seq"
    " FROM e UNION ALL SELECT instance_id, 1, since, seq FROM r) u"
    " ORDER BY part, since, seq LIMIT %(limit)s)"
    f" {sql.LEASE_SET} WHERE instance_id IN (SELECT instance_id FROM c)"
    f" RETURNING instance_id, lease_epoch, {sql.HEAD_COLUMNS}, {sql.LEASED_PARKED_VALUE},"
    f" {sql.LEASED_HISTORY_EMPTY},"
    " ready_ms, lease_expires_ms, instance_id IN (SELECT instance_id FROM e)"
)
# Renew a batch: the locking read skips held rows; the outer reads see the statement's
# snapshot, where a skipped row still matches: reported as busy (0), not lost.
RENEW_BATCH = (
    "WITH l AS (SELECT {key} FROM {table} WHERE {where} FOR NO KEY UPDATE SKIP LOCKED),"
    " u AS (UPDATE {table} SET {set} WHERE {key} IN (SELECT {key} FROM l)"
    " RETURNING {columns})"
    " SELECT {columns}, 1 FROM u UNION ALL SELECT {columns}, 0 FROM {table}"
    " WHERE {where} AND {key} NOT IN (SELECT {key} FROM u)"
)
# Transaction-level advisory locks of flow control, in order: the rate-limited queues
# (class QUEUE_LOCK_CLASS), then the concurrency keys (KEY_LOCK_CLASS), each sorted.
LOCK_LIMITS = (
    "SELECT pg_advisory_xact_lock(c, hashtext(n)) FROM (SELECT c, n"
    " FROM unnest(%(classes)s::int[], %(names)s::text[]) AS l (c, n) ORDER BY c, n) s"
)
QUEUE_LOCK_CLASS = 0x5376_0001
KEY_LOCK_CLASS = 0x5376_0002
# The due timers' and their instances' rows are locked, skipping held ones.
DUE_TIMERS_LOCK = " FOR NO KEY UPDATE OF i, t SKIP LOCKED"
# The wake condition of an arrival in the statements below: unless the execution that ran
# the attempt inline holds the lease, read from the locked row (i), which is the row's
# newest version; the statement's snapshot may predate a lease that changed hands while
# it waited for that lock.
NOT_HELD_BY_LOCKED = (
    " AND EXISTS (SELECT 1 FROM i WHERE NOT (i.lease_owner = %(held_owner)s"
    " AND i.lease_epoch = %(held_epoch)s))"
)
# complete_task in one statement: the instance row first (i; {skip}: SKIP LOCKED in a
# batch, which then leaves a busy row to a write of its own), then the claim-checked
# task update (t), the history value (h) and the wake (w), then the NOTIFY, and whether
# the instance row was locked.
COMPLETE_TASK = (
    "WITH i AS (SELECT instance_id, lease_owner, lease_epoch FROM {instance}"
    " WHERE instance_id = %(lock_instance_id)s FOR NO KEY UPDATE{skip}),"
    " t AS ({complete} AND EXISTS (SELECT 1 FROM i) RETURNING id),"
    " h AS ({record} AND EXISTS (SELECT 1 FROM t) RETURNING id),"
    " w AS ({wake} AND EXISTS (SELECT 1 FROM t) RETURNING instance_id)"
    " SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM w), {notify},"
    " (SELECT count(*) FROM i)"
)
# reserve_activity in one statement: fence (f), history row (h), task (t), then whether
# the released instance is still runnable (r), and the NOTIFYs.
RESERVE_ACTIVITY = (
    "WITH f AS ({fence} RETURNING instance_id, runnable),"
    " h AS ({history} RETURNING id),"
    " t AS (INSERT INTO {task} ({columns}) SELECT {values} FROM h RETURNING id),"
    " r AS (SELECT 1 FROM f WHERE runnable)"
    " SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM r), (SELECT id FROM t),"
    " {notify}, {wake}"
)
# reserve_activity with the inline result it carries, in one statement: the instance row
# locked first (i), the claim-checked task (d), its history value (v), the wake of another
# holder when ours is gone (w), then, only when the result was recorded, the reservation
# as RESERVE_ACTIVITY writes it (f, h, t, r). {reserved}: the reservation's history row
# (not {history}, the table name the result's record names).
RESERVE_WITH_INLINE = (
    "WITH i AS (SELECT instance_id, lease_owner, lease_epoch FROM {instance}"
    " WHERE instance_id = %(lock_instance_id)s FOR NO KEY UPDATE),"
    " d AS ({complete} AND EXISTS (SELECT 1 FROM i) RETURNING id),"
    " v AS ({record} AND EXISTS (SELECT 1 FROM d) RETURNING id),"
    " w AS ({wake} AND EXISTS (SELECT 1 FROM d) RETURNING instance_id),"
    " f AS ({fence} AND EXISTS (SELECT 1 FROM d) RETURNING instance_id, runnable),"
    " h AS ({reserved} RETURNING id),"
    " t AS (INSERT INTO {task} ({columns}) SELECT {values} FROM h RETURNING id),"
    " r AS (SELECT 1 FROM f WHERE runnable)"
    " SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM r), (SELECT id FROM t),"
    " {notify}, {wake_runnable}, (SELECT count(*) FROM d), (SELECT count(*) FROM w), {woken}"
)
# close in one statement: the fenced close (c), the close record (h) and the NOTIFY.
CLOSE = (
    "WITH c AS ({close} RETURNING instance_id), h AS ({history} RETURNING id)"
    " SELECT (SELECT count(*) FROM c), {notify}"
)

# A start that records its first activity, in one statement: the instance (i), its
# first command's row ({row}, from i) and its queued task ({queued}, from i), then
# whether the instance was inserted, and the NOTIFYs.
START_WITH_TASK = (
    "WITH i AS ({start} RETURNING instance_id), h AS ({row} RETURNING id),"
    " t AS ({queued} RETURNING id) SELECT (SELECT count(*) FROM i), {notify}"
)

# A runnable start as one statement: the instance (i), then whether it was inserted, and
# the dispatchers' NOTIFY (sent only when it was).
START_NOTIFYING = (
    "WITH i AS ({start} RETURNING instance_id) SELECT (SELECT count(*) FROM i), {notify}"
)

# A start with its search attributes as one statement: the instance (i), its attribute
# rows from i ({rows}: START_ATTRIBUTE_ROW each, so nothing is inserted when the id was
# taken), then whether the instance was inserted, and the NOTIFYs.
START_WITH_ATTRIBUTES = (
    "WITH i AS ({start} RETURNING instance_id), a AS (INSERT INTO {attribute}"
    " (instance_id, name, kind, text_value, number_value, time_value)"
    " SELECT i.instance_id, v.name, v.kind, v.text_value, v.number_value, v.time_value"
    " FROM i, (VALUES {rows}) AS v (name, kind, text_value, number_value, time_value)"
    " RETURNING id) SELECT (SELECT count(*) FROM i), {notify}"
)
# One attribute row of START_WITH_ATTRIBUTES, typed (a VALUES column of NULLs must still
# have its column's type).
START_ATTRIBUTE_ROW = (
    "(%s, %s, %s, CAST(%s AS double precision), CAST(%s AS timestamp with time zone))"
)

# complete_closing in one statement: the instance row locked first (i), the
# claim-checked task (t) and its history value (r); then, when the locked row is as its
# start left it (k), the close (c) and its record (h), else the wake (w).
COMPLETE_CLOSING = (
    "WITH i AS (SELECT instance_id, lease_owner, lease_epoch, status, cancel_requested"
    " FROM {instance} WHERE instance_id = %(lock_instance_id)s FOR NO KEY UPDATE),"
    " t AS ({complete} AND EXISTS (SELECT 1 FROM i) RETURNING id),"
    " r AS ({record} AND EXISTS (SELECT 1 FROM t) RETURNING id),"
    " k AS (SELECT 1 FROM i WHERE lease_owner = '' AND lease_epoch = 0"
    " AND status = %(lock_running)s"
    " AND NOT cancel_requested AND EXISTS (SELECT 1 FROM t)),"
    " c AS ({close} AND EXISTS (SELECT 1 FROM k) RETURNING instance_id),"
    " h AS ({closerow} RETURNING id),"
    " w AS ({wake} AND EXISTS (SELECT 1 FROM t) AND NOT EXISTS (SELECT 1 FROM k)"
    " RETURNING instance_id)"
    " SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM c), (SELECT count(*) FROM w),"
    " {notify}, {woken}"
)

# close with the inline result it carries, in one statement: the instance row locked
# first (i), the claim-checked task (t), its history value (r), the wake of another
# holder when ours is gone (w), then, only when the result was recorded, the fenced
# close (c) and its record (h). {closerow}: the close record's insert (from c).
CLOSE_WITH_INLINE = (
    "WITH i AS (SELECT instance_id, lease_owner, lease_epoch FROM {instance}"
    " WHERE instance_id = %(lock_instance_id)s FOR NO KEY UPDATE),"
    " t AS ({complete} AND EXISTS (SELECT 1 FROM i) RETURNING id),"
    " r AS ({record} AND EXISTS (SELECT 1 FROM t) RETURNING id),"
    " w AS ({wake} AND EXISTS (SELECT 1 FROM t) RETURNING instance_id),"
    " c AS ({close} AND EXISTS (SELECT 1 FROM t) RETURNING instance_id),"
    " h AS ({closerow} RETURNING id)"
    " SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM c), (SELECT count(*) FROM w),"
    " {notify}, {woken}"
)

# The server's autovacuum setting (selvedge.W006).
SHOW_AUTOVACUUM = "SHOW autovacuum"

# A signal in one statement (no idempotency key, outside a transaction): the instance
# marked runnable (w: the wake of a running instance, sql.WAKE_RUNNING, narrowed by
# APPEND_SIGNAL_WAKE), the signal (s) from w; then whether w woke, the new id, and the
# NOTIFY from s.
APPEND_SIGNAL = (
    "WITH w AS ({wake} RETURNING instance_id),"
    " s AS (INSERT INTO {signal} ({columns}) SELECT {values} FROM w RETURNING id)"
    " SELECT (SELECT count(*) FROM w), (SELECT id FROM s), {notify}"
)
# The wake of APPEND_SIGNAL happens only while the instance holds fewer than {below}'s
# count of unconsumed signals, and is the row version this statement's snapshot read (the
# xmin test): then the count is the one at the row's lock, as the two-statement path
# counts after locking. A row another transaction changed since the snapshot (another
# sender, a receive) makes w touch nothing, and the caller takes the two-statement path.
APPEND_SIGNAL_WAKE = (
    " AND xmin = (SELECT xmin FROM {instance} WHERE instance_id = %(wake_instance_id)s) AND {below}"
)

# A receive in one statement, reads included: the oldest unconsumed signal of the
# channel (n); the fence (f, when one was found; with no cancel request when the scope
# observes cancellation); the signal consumed, delivered with the batch when it was
# not (c); the received row, its value the signal's payload, inserted delivered (h);
# the rest of the batch (d, s); the cancel request as the snapshot shows it, for the
# case where no signal was found and nothing was written.
RECEIVE_NEXT = (
    "WITH n AS (SELECT id, channel, delivered_seq IS NULL AS fresh FROM {signal}"
    " WHERE instance_id = %(instance_id)s AND channel = %(channel)s AND consumed_seq IS NULL"
    " ORDER BY id LIMIT 1),"
    " f AS ({fence} AND EXISTS (SELECT 1 FROM n) RETURNING instance_id),"
    " c AS (UPDATE {signal} SET consumed_seq = %(seq)s, consumed_key = %(key)s,"
    " delivered_seq = COALESCE(delivered_seq, %(seq)s)"
    " WHERE id = (SELECT id FROM n) AND instance_id = %(instance_id)s AND consumed_seq IS NULL"
    " AND EXISTS (SELECT 1 FROM f) RETURNING id, payload),"
    " h AS (INSERT INTO {history} (instance_id, key, seq, command, event_type, data,"
    " reservation, delivered_seq, created_at, arrived_at)"
    " SELECT %(instance_id)s, %(key)s, %(seq)s, %(command)s, %(event_type)s, c.payload, NULL,"
    " %(seq)s, %(created_at)s, NULL FROM c RETURNING id),"
    " d AS (UPDATE {history} SET delivered_seq = %(seq)s WHERE instance_id = %(instance_id)s"
    " AND delivered_seq IS NULL AND data IS NOT NULL AND seq IS NOT NULL"
    " AND EXISTS (SELECT 1 FROM c) RETURNING id, key),"
    " s AS (UPDATE {signal} SET delivered_seq = %(seq)s WHERE instance_id = %(instance_id)s"
    " AND delivered_seq IS NULL AND id <> (SELECT id FROM c) RETURNING id, channel),"
    " x AS (SELECT cancel_requested, cancel_reason FROM {instance}"
    " WHERE instance_id = %(instance_id)s)"
    " SELECT (SELECT id FROM n), (SELECT count(*) FROM f), (SELECT count(*) FROM c),"
    " (SELECT fresh FROM n), (SELECT payload FROM c), (SELECT array_agg(key ORDER BY id) FROM d),"
    " (SELECT array_agg(id ORDER BY id) FROM s), (SELECT array_agg(channel ORDER BY id) FROM s),"
    " (SELECT cancel_requested FROM x), (SELECT cancel_reason FROM x)"
)
# An activity attempt's stream write in one statement: the claim checked and share-locked
# (c), the instance's entry count and whether the stream is closed (s), the stream's next
# seq under its row lock (n), the entry (e), then the NOTIFY.
STREAM_WRITE_LIVE = (
    "WITH c AS (SELECT 1 FROM {task} WHERE id = %s AND claim_owner = %s AND claim_epoch = %s"
    " AND status = %s FOR SHARE),"
    " s AS (SELECT COALESCE(SUM(last_seq), 0) AS total, COALESCE(MAX(CASE WHEN key = %s"
    " AND closed THEN 1 ELSE 0 END), 0) AS closed FROM {stream} WHERE instance_id = %s),"
    " n AS (INSERT INTO {stream} (instance_id, key, last_seq, closed, updated_at)"
    " SELECT %s, %s, 1, false, %s FROM c, s WHERE s.closed = 0 AND s.total < %s"
    " ON CONFLICT (instance_id, key) DO UPDATE SET last_seq = {stream}.last_seq + 1,"
    " updated_at = excluded.updated_at WHERE NOT {stream}.closed RETURNING last_seq),"
    " e AS (INSERT INTO {stream_entry} (instance_id, key, seq, value, attempt, activity_id,"
    " written_at) SELECT %s, %s, last_seq, %s, %s, %s, %s FROM n RETURNING seq)"
    " SELECT (SELECT seq FROM e), (SELECT count(*) FROM c), {notify}"
)

# An arrival's wake ({update}: WAKE_RUNNING) carrying its own NOTIFY ({notify}, from w):
# the transaction needs no NOTIFY statement of its own at the end.
WAKE_NOTIFYING = "WITH w AS ({update} RETURNING 1) SELECT (SELECT count(*) FROM w), {notify}"
