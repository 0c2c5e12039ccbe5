"""Portable histories (``selvedge.history/v1``), replay checks and queries.

``export_history`` reads one consistent snapshot of an instance: its metadata,
its command history and its signals' delivery and consumption positions, but no
lease or owner. The ``signals`` section holds no payloads, but a consumed
signal's payload is the value its ``receive`` recorded, so it is in
``events[].data`` like every other recorded value; ``redact=True`` replaces
every value by its size and a keyed hash. ``parse_history`` is strict. ``replay_history``
runs the registered workflow code read-only against a history and raises
:class:`ReplayError` on divergence; ``query`` replays the same way and asks a
query handler at the point where replay stops. None of them takes a lease,
writes anything or fires hooks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from . import exceptions as exc
from .engine.codec import Codec
from .engine.context import WorkflowContext
from .engine.durations import optional_seconds
from .engine.events import Fence, HistoryRow, SignalPosition
from .engine.execution import Execution
from .engine.ports import ClaimedTask, ExecutionOutcome, ExecutionSnapshot
from .registry import get_workflow

__all__ = [
    "FORMAT",
    "RecordedEvent",
    "RecordedHistory",
    "RecordedInstance",
    "RecordedSignal",
    "export_history",
    "parse_history",
    "query",
    "replay_history",
    "replay_instance",
]

FORMAT = "selvedge.history/v1"


class _Absent:
    """A value that was never recorded (distinct from JSON null)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


def _text(value: Any) -> str | None:
    return None if value is ABSENT else json.dumps(value, separators=(",", ":"))


def _value(text: str | None) -> Any:
    return ABSENT if text is None else json.loads(text)


@dataclass
class RecordedEvent:
    """One command (or close) row; ``data``/``reservation`` may be ABSENT."""

    seq: int
    key: str
    command: str
    event_type: str
    data: Any = ABSENT
    data_type: str = "json"
    binary: Any = None
    reservation: Any = ABSENT
    delivered_seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "key": self.key,
            "command": self.command,
            "event_type": self.event_type,
        }
        if self.data is not ABSENT:
            out["data"] = self.data
        out["data_type"] = self.data_type
        out["binary"] = self.binary
        if self.reservation is not ABSENT:
            out["reservation"] = self.reservation
        out["delivered_seq"] = self.delivered_seq
        return out


@dataclass
class RecordedSignal:
    """A signal's positions, without its payload."""

    id: int
    channel: str
    delivered_seq: int = 0
    consumed_seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "channel": self.channel,
            "delivered_seq": self.delivered_seq,
            "consumed_seq": self.consumed_seq,
        }


@dataclass
class RecordedInstance:
    """Durable workflow metadata, without execution ownership."""

    instance_id: str
    workflow_name: str
    status: str
    input: Any = ABSENT
    output: Any = ABSENT
    cancel_requested: bool = False
    cancel_reason: str = ""
    parent_instance_id: str = ""
    parent_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instance_id": self.instance_id,
            "workflow_name": self.workflow_name,
            "status": self.status,
        }
        if self.input is not ABSENT:
            out["input"] = self.input
        if self.output is not ABSENT:
            out["output"] = self.output
        out.update(
            cancel_requested=self.cancel_requested,
            cancel_reason=self.cancel_reason,
            parent_instance_id=self.parent_instance_id,
            parent_key=self.parent_key,
        )
        return out


@dataclass
class RecordedHistory:
    """A portable snapshot of everything needed to replay one instance."""

    instance: RecordedInstance
    events: list[RecordedEvent] = field(default_factory=list)
    signals: list[RecordedSignal] = field(default_factory=list)
    format: str = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "instance": self.instance.to_dict(),
            "events": [event.to_dict() for event in self.events],
            "signals": [signal.to_dict() for signal in self.signals],
        }

    def to_json(self, indent: int | None = None) -> str:
        """Serialise as ``selvedge.history/v1`` JSON."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @property
    def closed(self) -> bool:
        return self.instance.status != "running"

    def close_event(self) -> RecordedEvent | None:
        for event in self.events:
            if event.command == "close":
                return event
        return None


# -- export -----------------------------------------------------------------------------


REDACTED = "$redacted"


def redacted(text: str) -> dict[str, Any]:
    """What a redacted export shows of a stored value: its size and a keyed hash.

    The hash is an HMAC-SHA256 keyed with the project's ``SECRET_KEY``, so equal
    values show equal hashes within one deployment, and whoever holds the export
    cannot test guesses (a card number, an email address) against it.
    """
    from django.utils.crypto import salted_hmac

    digest = salted_hmac("selvedge_django.history.redacted", text, algorithm="sha256")
    return {REDACTED: {"bytes": len(text.encode("utf-8")), "hmac_sha256": digest.hexdigest()}}


def _redacted_text(text: str) -> str:
    marker = redacted(text)[REDACTED]
    return f"(redacted: {marker['bytes']} bytes, hmac-sha256 {marker['hmac_sha256']})"


def export_history(instance_id: str, *, redact: bool = False) -> RecordedHistory:
    """Read one consistent snapshot of an instance as a portable history.

    Every recorded value is in it, consumed signal payloads included (in
    ``events[].data``). With ``redact=True`` each value (input, output or error,
    every event's ``data`` and ``reservation``) is replaced by
    ``{"$redacted": {"bytes": N, "hmac_sha256": "..."}}`` and a cancel reason by
    a note of the same; ids, names, keys, channels and positions stay. A redacted
    export is for sharing and inspection: it cannot be replayed.

    What it reads is bounded: a history of more than ``MAX_HISTORY_EVENTS``
    commands (and its close), or more signals than its commands and
    ``MAX_PENDING_SIGNALS`` can account for, raises :class:`HistoryLimitExceeded`
    after reading one row past the limit.
    """
    from .conf import get_settings
    from .models import HistoryEvent, SignalMessage
    from .operations import _store, known_id

    known_id(instance_id)
    store = _store()
    settings = get_settings()
    max_events = settings.max_history_events + 1  # the commands and the close
    max_signals = max_events + settings.max_pending_signals
    with store.read_snapshot():
        inst = store.get_instance(instance_id)
        rows = list(
            HistoryEvent.objects.using(store.alias)
            .filter(instance_id=instance_id)
            .order_by("id")
            .values_list(
                "seq", "key", "command", "event_type", "data", "reservation", "delivered_seq"
            )[: max_events + 1]
        )
        signals = list(
            SignalMessage.objects.using(store.alias)
            .filter(instance_id=instance_id)
            .order_by("id")
            .values_list("id", "channel", "delivered_seq", "consumed_seq")[: max_signals + 1]
        )
    if len(rows) > max_events or len(signals) > max_signals:
        raise exc.HistoryLimitExceeded(
            instance_id,
            "MAX_HISTORY_EVENTS",
            settings.max_history_events,
            f"the history of workflow instance {instance_id!r} is larger than "
            f"MAX_HISTORY_EVENTS ({settings.max_history_events}) and MAX_PENDING_SIGNALS "
            f"({settings.max_pending_signals}) allow a read to load",
        )
    value = (lambda text: ABSENT if text is None else redacted(text)) if redact else _value
    output: Any = ABSENT
    if inst.status == "completed" and inst.output is not None:
        output = value(inst.output)
    elif inst.error is not None:
        output = value(inst.error)
    input_value: Any = inst.input
    if redact:
        input_value = redacted(json.dumps(inst.input, separators=(",", ":"), ensure_ascii=False))
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
    )


# -- parse ------------------------------------------------------------------------------

_TOP = {"format", "instance", "events", "signals"}
_INSTANCE = {
    "instance_id": str,
    "workflow_name": str,
    "status": str,
    "input": object,
    "output": object,
    "cancel_requested": bool,
    "cancel_reason": str,
    "parent_instance_id": str,
    "parent_key": str,
}
_INSTANCE_REQUIRED = {"instance_id", "workflow_name", "status"}
_EVENT = {
    "seq": int,
    "key": str,
    "command": str,
    "event_type": str,
    "data": object,
    "data_type": str,
    "binary": object,
    "reservation": object,
    "delivered_seq": int,
}
_EVENT_REQUIRED = {"seq", "key", "command", "event_type"}
_SIGNAL = {"id": int, "channel": str, "delivered_seq": int, "consumed_seq": int}
_STATUSES = {"running", "completed", "failed", "cancelled"}
# Go's encoding/json decodes null into a field's zero value, and the Go engine's
# exports can hold such nulls (nil slices, zero-valued rows): read null as that zero
# value where it is a valid one. Identity fields have none; ``input``, ``output``,
# ``data`` and ``reservation`` are raw JSON, where null is a recorded null.
_ZERO_INSTANCE = {
    "cancel_requested": False,
    "cancel_reason": "",
    "parent_instance_id": "",
    "parent_key": "",
}
_ZERO_EVENT = {"seq": 0, "delivered_seq": 0, "data_type": "json"}
_ZERO_SIGNAL = {"delivered_seq": 0, "consumed_seq": 0}


def _fail(message: str) -> exc.UnsupportedHistoryFormat:
    return exc.UnsupportedHistoryFormat(message)


def _check_object(
    value: Any,
    where: str,
    fields: dict[str, type],
    required: set[str],
    zeros: dict[str, Any],
) -> dict[str, Any]:
    """Check one object's fields and types; return it with nulls read as ``zeros``."""
    if not isinstance(value, dict):
        raise _fail(f"{where} must be an object")
    for name in value:
        if name not in fields:
            raise _fail(f"unknown field {where}.{name}")
    for name in required:
        if name not in value:
            raise _fail(f"missing field {where}.{name}")
    value = {
        name: zeros[name] if item is None and name in zeros else item
        for name, item in value.items()
    }
    for name, kind in fields.items():
        if name not in value or kind is object:
            continue
        item = value[name]
        ok = isinstance(item, kind) and not (kind is int and isinstance(item, bool))
        if not ok:
            got = "null" if item is None else type(item).__name__
            raise _fail(f"field {where}.{name} must be {kind.__name__}, not {got}")
    return value


def _list(doc: dict[str, Any], name: str) -> list[Any]:
    """A top-level list; absent or null (a Go nil slice) is empty."""
    items = doc.get(name)
    if items is None:
        return []
    if not isinstance(items, list):
        raise _fail(f"field {name} must be a list")
    return items


def parse_history(data: str | bytes | bytearray) -> RecordedHistory:
    """Strictly decode a ``selvedge.history/v1`` document.

    Text that is not JSON, unknown fields, a different format or version and
    wrong types raise :class:`UnsupportedHistoryFormat` naming the problem. As
    Go's decoder does, ``null`` reads as the zero value of a field that has a
    valid one (an empty list, ``0``, ``""``, ``false``; ``"json"`` for
    ``data_type``), so histories exported by the Go engine load; raw JSON fields
    (``input``, ``output``, ``data``, ``reservation``) keep null as a recorded null.
    """
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as error:
            raise _fail(f"history is not UTF-8 text: {error}") from error
    if not isinstance(data, str):
        raise _fail("history must be JSON text")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise _fail(f"history is not JSON: {error}") from error
    if not isinstance(doc, dict):
        raise _fail("history must be a JSON object")
    for name in doc:
        if name not in _TOP:
            raise _fail(f"unknown field {name}")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise _fail(f"unsupported format {fmt!r} (expected {FORMAT!r})")
    inst = _check_object(
        doc.get("instance"), "instance", _INSTANCE, _INSTANCE_REQUIRED, _ZERO_INSTANCE
    )
    if inst["status"] not in _STATUSES:
        raise _fail(f"field instance.status has unknown value {inst['status']!r}")
    events_raw = _list(doc, "events")
    signals_raw = _list(doc, "signals")
    events: list[RecordedEvent] = []
    keys: set[str] = set()
    for index, raw in enumerate(events_raw):
        event = _check_object(raw, f"events[{index}]", _EVENT, _EVENT_REQUIRED, _ZERO_EVENT)
        if event.get("data_type") == "":
            event["data_type"] = "json"  # Go's zero value
        if event.get("data_type", "json") != "json":
            raise _fail(f"field events[{index}].data_type {event['data_type']!r} is unsupported")
        if event.get("binary") is not None:
            raise _fail(f"field events[{index}].binary is unsupported")
        if event["key"] in keys:
            raise _fail(f"events[{index}] repeats key {event['key']!r}")
        keys.add(event["key"])
        events.append(
            RecordedEvent(
                seq=event["seq"],
                key=event["key"],
                command=event["command"],
                event_type=event["event_type"],
                data=event.get("data", ABSENT),
                reservation=event.get("reservation", ABSENT),
                delivered_seq=event.get("delivered_seq", 0),
            )
        )
    signals = [
        RecordedSignal(s["id"], s["channel"], s.get("delivered_seq", 0), s.get("consumed_seq", 0))
        for index, raw in enumerate(signals_raw)
        for s in [_check_object(raw, f"signals[{index}]", _SIGNAL, {"id", "channel"}, _ZERO_SIGNAL)]
    ]
    return RecordedHistory(
        instance=RecordedInstance(
            instance_id=inst["instance_id"],
            workflow_name=inst["workflow_name"],
            status=inst["status"],
            input=inst.get("input", ABSENT),
            output=inst.get("output", ABSENT),
            cancel_requested=inst.get("cancel_requested", False),
            cancel_reason=inst.get("cancel_reason", ""),
            parent_instance_id=inst.get("parent_instance_id", ""),
            parent_key=inst.get("parent_key", ""),
        ),
        events=events,
        signals=signals,
    )


# -- read-only replay -------------------------------------------------------------------


class _NoStore:
    """Replay never reaches storage: every unrecorded step stops the replay first."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"read-only replay tried to use the store ({name})")


class ReplayRuntime:
    """The runtime of read-only replays: no store, no activities, no hooks."""

    worker_id = "replay"

    def __init__(self) -> None:
        from .conf import get_settings
        from .runtime import client_codec

        settings = get_settings()
        self.store: Any = _NoStore()
        self.codec: Codec = client_codec(settings)
        self._clock = settings.clock

    def clock(self) -> datetime:
        now: datetime = self._clock()
        return now

    def lease_valid(self, fence: Fence) -> bool:
        return True

    def can_run_inline(self, activity_name: str, queue: str) -> bool:
        return False

    def run_attempt(self, task: ClaimedTask) -> tuple[str, str] | None:
        raise RuntimeError("read-only replay does not run activities")

    def tasks_reserved(self) -> None:
        return None

    def fire(self, hook: str, **fields: Any) -> None:
        return None


def _snapshot(history: RecordedHistory) -> ExecutionSnapshot:
    inst = history.instance
    return ExecutionSnapshot(
        instance_id=inst.instance_id,
        workflow_name=inst.workflow_name,
        input=None if inst.input is ABSENT else inst.input,
        status=inst.status,
        cancel_requested=inst.cancel_requested,
        cancel_reason=inst.cancel_reason,
        parent_instance_id=inst.parent_instance_id,
        parent_key=inst.parent_key,
        history=[
            HistoryRow(
                key=e.key,
                seq=e.seq or None,
                command=e.command,
                event_type=e.event_type,
                data=_text(e.data),
                reservation=_text(e.reservation),
                delivered_seq=e.delivered_seq or None,
            )
            for e in history.events
        ],
        signals=[
            SignalPosition(s.id, s.channel, s.delivered_seq or None, s.consumed_seq or None)
            for s in history.signals
            if s.delivered_seq
        ],
    )


def _replay(
    history: RecordedHistory,
    deadline: float | None = None,
    on_deadline: Callable[[], BaseException] | None = None,
) -> tuple[Execution, ExecutionOutcome]:
    definition = get_workflow(history.instance.workflow_name)
    if definition is None:
        raise exc.WorkflowNotRegistered(history.instance.workflow_name)
    execution = Execution(ReplayRuntime(), _snapshot(history), None, readonly=True)
    execution.deadline, execution.on_deadline = deadline, on_deadline
    outcome = execution.run(definition.fn, WorkflowContext(execution, execution.root_scope))
    return execution, outcome


def _error_matches(recorded: Any, replayed: BaseException | None) -> bool:
    from .engine.codec import error_to_envelope

    if replayed is None or not isinstance(recorded, dict):
        return False
    env = error_to_envelope(replayed, with_traceback=False)
    return env.get("type") == recorded.get("type") and env.get("message") == recorded.get("message")


def _json_equal(a: Any, b: Any) -> bool:
    """Compare JSON values: key order and number spelling do not matter, ``true`` is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def replay_history(history: RecordedHistory) -> None:
    """Check the registered workflow code against a recorded history.

    A running history may stop at its recorded frontier; a closed one must reach
    the recorded close with the same outcome, unless something other than its
    code closed it (a terminate, or too many storage errors): then, as for a
    running one, only its commands must match. Raises :class:`ReplayError` whose
    ``divergence`` is a :class:`NondeterminismError` (commands) or a
    :class:`ReplayOutcomeError` (outcome), and whose ``workflow_error`` is the
    error the replayed code raised, if any.
    """
    inst = history.instance
    execution, outcome = _replay(history)
    divergence: BaseException | None = None
    # A run closed from outside its code (terminated, or failed on storage errors) is
    # checked like a running one: its commands must match, wherever it then stops.
    closed_by_code = history.closed and not _closed_from_outside(inst.output)
    if isinstance(outcome.error, exc.NondeterminismError):
        divergence = outcome.error
    elif not closed_by_code:
        pass
    elif outcome.kind == "suspended":
        divergence = exc.NondeterminismError(
            f"replay of {inst.instance_id!r} stopped at command {execution.seq} "
            f"({execution.suspension}) before the recorded close",
            instance_id=inst.instance_id,
        )
    else:
        recorded_status = inst.status
        if outcome.kind == "completed":
            # Compare what the close would record: the output's JSON value (an output
            # that cannot be encoded becomes the same failure it became live).
            encoded = execution.close_request(outcome).output
            if encoded is not None:
                outcome.output = json.loads(encoded)
        replayed_status = outcome.kind
        if outcome.kind == "completed":
            if recorded_status == "completed" and _json_equal(inst.output, outcome.output):
                return
        elif outcome.kind in ("failed", "cancelled"):
            if recorded_status == "cancelled" and isinstance(outcome.error, exc.Cancelled):
                return
            if recorded_status == outcome.kind and _error_matches(inst.output, outcome.error):
                return
            if recorded_status == "failed" and _error_matches(inst.output, outcome.error):
                return
        divergence = exc.ReplayOutcomeError(
            inst.instance_id,
            recorded_status,
            replayed_status,
            None if inst.output is ABSENT else inst.output,
            outcome.output if outcome.kind == "completed" else repr(outcome.error),
        )
    if divergence is not None:
        workflow_error = outcome.workflow_error or outcome.error
        raise exc.ReplayError(inst.instance_id, divergence, workflow_error)


def _closed_from_outside(recorded_error: Any) -> bool:
    """Whether a recorded failure was written without the workflow code's say: a
    terminate, or the failure of an instance whose writes the database kept refusing."""
    return (
        isinstance(recorded_error, dict)
        and recorded_error.get("kind") == "engine"
        and recorded_error.get("type") in ("WorkflowTerminated", "ExecutionStorageError")
    )


def replay_instance(instance_id: str) -> None:
    """Export an instance and check the registered workflow code against it."""
    replay_history(export_history(instance_id))


# -- queries ----------------------------------------------------------------------------


def query(instance_id: str, name: str, *, timeout: float | timedelta | None = None) -> Any:
    """Answer a query from one snapshot replay: no lease, no writes, no hooks.

    Replay stops before the first unrecorded command or blocking wait (or at the
    close) and the handler registered under ``name`` at that point runs there.
    The answer passes through JSON.

    ``timeout`` (seconds or a ``timedelta``, counted from the call) is checked at
    every command boundary of the replay, as the seeds check a caller's
    cancellation: once it has passed, the replay stops there and
    :class:`QueryTimeout` (a ``TimeoutError``) is raised without running the
    handler. Workflow code between two commands, and the handler itself, are not
    interrupted.
    """
    seconds = optional_seconds(timeout, "query timeout")
    deadline = None if seconds is None else time.monotonic() + seconds
    if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= 255:
        raise exc.QueryNotFound(str(name))
    history = export_history(instance_id)

    def expired() -> BaseException:
        return exc.QueryTimeout(instance_id, name, seconds or 0.0)

    execution, outcome = _replay(history, deadline, expired)
    if isinstance(execution.fatal, exc.QueryTimeout):
        raise execution.fatal
    if deadline is not None and time.monotonic() >= deadline:
        raise expired()  # the replay's last boundary was in time, but not the answer
    if isinstance(outcome.error, exc.NondeterminismError):
        raise outcome.error
    handler = execution.query_handlers.get(name)
    if handler is None:
        raise exc.QueryNotFound(name)
    try:
        with execution.answering_query():
            answer = handler()
    except exc.QueryCommandError:
        raise
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise
        raise exc.QueryFailed(name, error) from error
    try:
        return json.loads(ReplayRuntime().codec.encode(answer, f"answer to query {name!r}"))
    except (TypeError, ValueError) as error:
        raise exc.QueryFailed(name, error) from error
