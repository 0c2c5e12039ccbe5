"""History operations: export an instance, check code against histories, answer queries.

``export_history`` reads one consistent snapshot of an instance: its metadata,
its command history and its signals' delivery and consumption positions, but no
lease or owner. The ``signals`` section holds no payloads, but a consumed
signal's payload is the value its ``receive`` recorded, so it is in
``events[].data`` like every other recorded value; ``redact=True`` replaces
every value by its size and a keyed hash. ``replay_history`` runs the registered
workflow code read-only against a history (:mod:`selvedge_django.engine.replay`)
and raises :class:`ReplayError` on divergence; ``query`` replays the same way and
asks a query handler at the point where replay stops. None of them takes a
lease, writes anything or fires hooks.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone
from django.utils.crypto import salted_hmac

from .. import exceptions as exc
from ..conf import get_settings
from ..engine.durations import optional_seconds
from ..engine.portable import (
    ABSENT,
    RecordedArchivedEvent,
    RecordedEvent,
    RecordedHistory,
    RecordedInstance,
    RecordedSignal,
    RecordedStreamEntry,
    parse_history,
)
from ..engine.replay import (
    ReplayResult,
    ReplayRuntime,
    answer_query,
    check_replay,
    history_at,
    position_of,
)
from ..engine.replay import query_handler_names as list_query_handlers
from ..models import WorkflowInstance
from ..registry import get_workflow, registered_workflow_names
from ..storage import Store, client_codec
from .base import known_id, read_store

__all__ = [
    "REDACTED",
    "aexport_history",
    "aquery",
    "current_generation",
    "export_history",
    "history_rows",
    "query",
    "query_handler_names",
    "redacted",
    "replay_check",
    "replay_history",
    "replay_instance",
    "replay_runtime",
    "workflow_function",
]


def history_rows(
    store: Store, instance_id: str, *, max_events: int, max_signals: int
) -> tuple[WorkflowInstance, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Read an instance, its history rows and its signals' positions in one snapshot.

    The reads are storage's (:class:`~selvedge_django.storage.operator_reads.OperatorReads`),
    each bounded. Raises :class:`HistoryLimitExceeded` after reading one row past
    ``max_events`` rows or ``max_signals`` signals.
    """
    settings = get_settings()
    with store.read_snapshot():
        inst = store.get_instance(instance_id)
        rows = store.operator_reads.history_events(instance_id, max_events + 1)
        signals = store.operator_reads.signal_positions(instance_id, max_signals + 1)
    if len(rows) > max_events or len(signals) > max_signals:
        raise exc.HistoryLimitExceeded(
            instance_id,
            "MAX_HISTORY_EVENTS",
            settings.max_history_events,
            f"the history of workflow instance {instance_id!r} is larger than "
            f"MAX_HISTORY_EVENTS ({settings.max_history_events}) and MAX_PENDING_SIGNALS "
            f"({settings.max_pending_signals}) allow a read to load",
        )
    return inst, rows, signals


def archived_rows(
    store: Store, instance_id: str, value: Callable[[str | None], Any], limit: int
) -> list[RecordedArchivedEvent]:
    """The rows an instance's resumes archived, oldest generation first; at most ``limit``
    (:class:`HistoryLimitExceeded` past it)."""
    rows = store.operator_reads.archived_events(instance_id, limit + 1)
    if len(rows) > limit:
        raise exc.HistoryLimitExceeded(
            instance_id,
            "MAX_HISTORY_EVENTS",
            limit,
            f"workflow instance {instance_id!r} has more than {limit} archived history rows",
        )
    out: list[RecordedArchivedEvent] = []
    for seq, key, command, event_type, data, reservation, delivered, generation, at in rows:
        out.append(
            RecordedArchivedEvent(
                seq=seq or 0,
                key=key,
                command=command,
                event_type=event_type,
                data=value(data),
                reservation=value(reservation),
                delivered_seq=delivered or 0,
                generation=generation,
                archived_at=at.isoformat(),
            )
        )
    return out


REDACTED = "$redacted"


def redacted(text: str) -> dict[str, Any]:
    """What a redacted export shows of a stored value: its size and a keyed hash.

    The hash is an HMAC-SHA256 keyed with the project's ``SECRET_KEY``, so equal
    values show equal hashes within one deployment, and whoever holds the export
    cannot test guesses (a card number, an email address) against it.
    """
    digest = salted_hmac("selvedge_django.history.redacted", text, algorithm="sha256")
    return {REDACTED: {"bytes": len(text.encode("utf-8")), "hmac_sha256": digest.hexdigest()}}


def _redacted_text(text: str) -> str:
    marker = redacted(text)[REDACTED]
    return f"(redacted: {marker['bytes']} bytes, hmac-sha256 {marker['hmac_sha256']})"


def export_history(instance_id: str, *, redact: bool = False) -> RecordedHistory:
    """Read one consistent snapshot of an instance as a portable history.

    The snapshot is of ``SELVEDGE["READ_DATABASE"]`` when one is set (a replica, which
    may lag); queries and replay checks read their histories the same way.

    Every recorded value is in it, consumed signal payloads included (in
    ``events[].data``), and the instance's stream entries (``streams[]``). With
    ``redact=True`` each value (input, output or error, every event's ``data`` and
    ``reservation``, every stream entry's ``value``) is replaced by
    ``{"$redacted": {"bytes": N, "hmac_sha256": "..."}}`` and a cancel reason by
    a note of the same; ids, names, keys, channels and positions stay. A redacted
    export is for sharing and inspection: it cannot be replayed.

    What it reads is bounded: a history of more than ``MAX_HISTORY_EVENTS``
    commands (and its close), or more signals than its commands and
    ``MAX_PENDING_SIGNALS`` can account for, raises :class:`HistoryLimitExceeded`
    after reading one row past the limit.
    """
    return _export(instance_id, redact=redact, archived=True)


def _export(instance_id: str, *, redact: bool, archived: bool) -> RecordedHistory:
    """export_history; without ``archived`` the archived generations are not read (a
    replay checks the current one only, and a long chain of continue-as-new generations
    would otherwise grow what it reads without bound)."""
    known_id(instance_id)
    settings = get_settings()
    store = read_store()
    codec = store.codec

    def clear(text: str | None) -> Any:
        # What code reads: a payload codec's envelopes opened, error envelopes too.
        return ABSENT if text is None else codec.open_error(codec.decode(text))

    def clear_redacted(text: str | None) -> Any:
        if text is None:
            return ABSENT
        if codec.reader is not None:
            text = json.dumps(clear(text), separators=(",", ":"), ensure_ascii=False)
        return redacted(text)

    value = clear_redacted if redact else clear
    with store.read_snapshot():
        inst, rows, signals = history_rows(
            store,
            instance_id,
            max_events=settings.max_history_events + 1,  # the commands and the close
            max_signals=settings.max_history_events + 1 + settings.max_pending_signals,
        )
        old_rows = (
            archived_rows(store, instance_id, value, settings.max_history_events + 1)
            if archived
            else []
        )
        # A replay reads no stream: entries are outputs, never replayed.
        stream_rows = (
            store.streams.entries(instance_id, settings.max_stream_entries) if archived else []
        )
    output: Any = ABSENT
    if inst.status == "completed" and inst.output is not None:
        output = value(inst.output)
    elif inst.error is not None:
        output = value(inst.error)
    input_value: Any = codec.open(inst.input)
    if redact:
        input_value = redacted(json.dumps(input_value, separators=(",", ":"), ensure_ascii=False))
    reason = inst.cancel_reason
    if redact and reason:
        reason = _redacted_text(reason)
    return RecordedHistory(
        instance=RecordedInstance(
            instance_id=inst.instance_id,
            workflow_name=inst.workflow_name,
            status=inst.status,
            input=input_value,
            output=output,
            cancel_requested=inst.cancel_requested,
            cancel_reason=reason,
            parent_instance_id=inst.parent_instance_id,
            parent_key=inst.parent_key,
            parked_seq=inst.parked_seq if inst.status == "running" else 0,
            parked_key=inst.parked_key if inst.status == "running" else "",
            history_generation=inst.history_generation,
        ),
        events=[
            RecordedEvent(
                seq=seq or 0,
                key=key,
                command=command,
                event_type=event_type,
                data=value(data),
                reservation=value(reservation),
                delivered_seq=delivered or 0,
            )
            for seq, key, command, event_type, data, reservation, delivered in rows
        ],
        signals=[
            RecordedSignal(sid, channel, delivered or 0, consumed or 0)
            for sid, channel, delivered, consumed in signals
        ],
        archived=old_rows,
        streams=[
            RecordedStreamEntry(entry.key, entry.seq, value(entry.value), entry.attempt)
            for entry in stream_rows
        ],
    )


# -- replay checks and queries -----------------------------------------------------------


def _replay_runtime() -> ReplayRuntime:
    settings = get_settings()
    return ReplayRuntime(client_codec(settings), settings.clock)


def _workflow_function(history: RecordedHistory) -> Callable[[Any, Any], Any]:
    definition = get_workflow(history.instance.workflow_name)
    if definition is None:
        raise exc.WorkflowNotRegistered(history.instance.workflow_name)
    return definition.fn


def replay_history(history: RecordedHistory) -> ReplayResult:
    """Check the registered workflow code against a recorded history.

    A running history may stop at its recorded frontier; a closed one must reach
    the recorded close with the same outcome, unless something other than its
    code closed it (a terminate, or too many storage errors): then, as for a
    running one, only its commands must match. Raises :class:`ReplayError` whose
    ``divergence`` is a :class:`NondeterminismError` (commands) or a
    :class:`ReplayOutcomeError` (outcome), and whose ``workflow_error`` is the
    error the replayed code raised, if any. Returns a :class:`ReplayResult`: how
    the code went through each patch it met.
    """
    return check_replay(history, _workflow_function(history), _replay_runtime())


def replay_instance(instance_id: str) -> ReplayResult:
    """Export an instance and check the registered workflow code against it."""
    return replay_history(_current_generation(instance_id))


def _current_generation(instance_id: str) -> RecordedHistory:
    """What a replay of an instance reads: its current generation, nothing archived."""
    return _export(instance_id, redact=False, archived=False)


def replay_check(
    files: Sequence[tuple[str, bytes]] = (),
    *,
    recent: timedelta = timedelta(days=7),
    limit: int = 1000,
) -> Iterator[tuple[str, exc.SelvedgeError | ReplayResult]]:
    """Check the registered workflow code against histories; yield (label, error or result).

    With ``files`` ((name, ``selvedge.history/v1`` text) pairs) it checks those; an
    unreadable one yields its :class:`UnsupportedHistoryFormat`. Without, it
    checks the running instances of registered workflows (oldest first) and those
    closed within ``recent`` (newest first), at most ``limit`` of each. A check
    that fails yields the :class:`SelvedgeError` (a :class:`ReplayError` on
    divergence), one that matches its :class:`ReplayResult`; the next one still runs.
    """
    if files:
        sources: list[tuple[str, Callable[[], RecordedHistory]]] = [
            (name, functools.partial(parse_history, data)) for name, data in files
        ]
    else:
        sources = [
            (instance_id, functools.partial(_current_generation, instance_id))
            for instance_id in _replay_candidates(recent, limit)
        ]
    for label, load in sources:
        try:
            result = replay_history(load())
        except exc.SelvedgeError as error:
            yield label, error
        else:
            yield label, result


def _replay_candidates(recent: timedelta, limit: int) -> list[str]:
    reads = read_store().operator_reads
    names = registered_workflow_names()
    ids = reads.running_ids(names, limit)
    if recent.total_seconds() > 0:
        ids += reads.closed_ids(names, timezone.now() - recent, limit)
    return ids


def query(
    instance_id: str,
    name: str,
    *,
    timeout: float | timedelta | None = None,
    at: str | int | None = None,
) -> Any:
    """Answer a query from one snapshot replay: no lease, no writes, no hooks.

    Replay stops before the first unrecorded command or blocking wait (or at the
    close) and the handler registered under ``name`` at that point runs there.
    The answer passes through JSON.

    ``at`` (a history key such as ``"#5:shop.charge_payment"``, or a command
    position, its ``seq``) answers as of that step instead: the replay uses the
    history as it stood once that command was recorded (later commands, and
    deliveries and signals consumed after it, left out), so it stops before the
    next command and the handler answers with what the code held then. A key or
    position the history does not record raises :class:`HistoryKeyNotFound`;
    the close record's key (``$close``) means the whole history.

    ``timeout`` (seconds or a ``timedelta``, counted from the call) is checked at
    every command boundary of the replay, as the seeds check a caller's
    cancellation: once it has passed, the replay stops there and
    :class:`QueryTimeout` (a ``TimeoutError``) is raised without running the
    handler. The handler's Python code is interrupted once the timeout has passed,
    and :class:`QueryTimeout` raised (see :mod:`selvedge_django.engine.interrupt`
    for what cannot be interrupted: a blocking C call). Workflow code between two
    commands is not interrupted.
    """
    seconds = optional_seconds(timeout, "query timeout")
    deadline = None if seconds is None else time.monotonic() + seconds
    if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= 255:
        raise exc.QueryNotFound(str(name))
    history = _history_at(instance_id, at)
    return answer_query(
        history,
        _workflow_function(history),
        _replay_runtime(),
        name,
        deadline=deadline,
        seconds=seconds,
    )


def _history_at(instance_id: str, at: str | int | None) -> RecordedHistory:
    """The current generation of an instance, cut after the command ``at`` names."""
    history = _current_generation(instance_id)
    if at is None:
        return history
    seq = position_of(history, at)
    return history if seq is None else history_at(history, seq)


def query_handler_names(
    instance_id: str,
    *,
    timeout: float | timedelta | None = None,
    at: str | int | None = None,
) -> list[str]:
    """Return the query handlers an instance has registered where its replay stops.

    One snapshot replay, as :func:`query` does (same ``timeout`` and ``at``
    rules), without running a handler: the names :func:`query` answers there, sorted.
    """
    seconds = optional_seconds(timeout, "query timeout")
    deadline = None if seconds is None else time.monotonic() + seconds
    history = _history_at(instance_id, at)
    return list_query_handlers(
        history, _workflow_function(history), _replay_runtime(), deadline=deadline, seconds=seconds
    )


# What the debugger (operations/debugging.py) replays with, as queries do.
current_generation = _current_generation
replay_runtime = _replay_runtime
workflow_function = _workflow_function

aquery = sync_to_async(query)
aexport_history = sync_to_async(export_history)
