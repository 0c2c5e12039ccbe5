"""Portable histories: ``selvedge.history/v1`` records and their strict parser.

A :class:`RecordedHistory` holds everything needed to replay one instance: its
metadata, its command rows and its signals' delivery and consumption positions,
never a lease or owner. ``parse_history`` reads the format strictly; the
operations layer exports an instance into it, and :mod:`.replay` runs workflow
code against it. Nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .. import exceptions as exc

__all__ = [
    "ABSENT",
    "FORMAT",
    "RecordedEvent",
    "RecordedHistory",
    "RecordedInstance",
    "RecordedSignal",
    "RecordedStreamEntry",
    "parse_history",
    "recorded_text",
    "recorded_value",
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


def recorded_text(value: Any) -> str | None:
    """The stored JSON text of a recorded value (None for ABSENT)."""
    return None if value is ABSENT else json.dumps(value, separators=(",", ":"))


def recorded_value(text: str | None) -> Any:
    """A recorded value from its stored JSON text (ABSENT for None)."""
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
    # Where the last execution of a running instance suspended at a wait that records
    # nothing (0 and "": nowhere). Exported only when set; Go's format has no such field.
    parked_seq: int = 0
    parked_key: str = ""
    # The generation the current history began with (a continue-as-new opened it):
    # default child ids name it. Exported only above 1; Go's format has no such field.
    history_generation: int = 1

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
        if self.parked_seq:
            out.update(parked_seq=self.parked_seq, parked_key=self.parked_key)
        if self.history_generation > 1:
            out["history_generation"] = self.history_generation
        return out


@dataclass
class RecordedArchivedEvent(RecordedEvent):
    """A row a resume archived: the generation it belonged to, and when it was archived
    (ISO 8601). Listed in ``archived[]``; never replayed."""

    generation: int = 1
    archived_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["generation"] = self.generation
        out["archived_at"] = self.archived_at
        return out


@dataclass
class RecordedStreamEntry:
    """One stream entry: its stream's key, seq, value and the activity attempt that
    wrote it (None: the workflow). Listed in ``streams[]``; never replayed."""

    key: str
    seq: int
    value: Any
    attempt: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "seq": self.seq, "value": self.value, "attempt": self.attempt}


@dataclass
class RecordedHistory:
    """A portable snapshot of everything needed to replay one instance.

    ``archived`` lists the rows earlier generations archived (resumes), oldest
    generation first; an export without any has no ``archived`` field, exactly
    as before resumes existed. Replay reads ``events`` only: the current
    generation is what replays.
    """

    instance: RecordedInstance
    events: list[RecordedEvent] = field(default_factory=list)
    signals: list[RecordedSignal] = field(default_factory=list)
    format: str = FORMAT
    archived: list[RecordedArchivedEvent] = field(default_factory=list)
    # The instance's stream entries, by key then seq; an export without any has no
    # ``streams`` field.
    streams: list[RecordedStreamEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": self.format,
            "instance": self.instance.to_dict(),
            "events": [event.to_dict() for event in self.events],
            "signals": [signal.to_dict() for signal in self.signals],
        }
        if self.archived:
            out["archived"] = [event.to_dict() for event in self.archived]
        if self.streams:
            out["streams"] = [entry.to_dict() for entry in self.streams]
        return out

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


# -- parse ------------------------------------------------------------------------------

_TOP = {"format", "instance", "events", "signals", "archived", "streams"}
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
    "parked_seq": int,
    "parked_key": str,
    "history_generation": int,
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
    "parked_seq": 0,
    "parked_key": "",
    "history_generation": 1,
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
    if inst.get("parked_seq", 0) < 0:
        raise _fail("field instance.parked_seq must not be negative")
    if inst.get("history_generation", 1) < 1:
        raise _fail("field instance.history_generation must be at least 1")
    if inst["status"] not in _STATUSES:
        raise _fail(f"field instance.status has unknown value {inst['status']!r}")
    events_raw = _list(doc, "events")
    signals_raw = _list(doc, "signals")
    archived = _parse_archived(_list(doc, "archived"))
    streams = _parse_streams(_list(doc, "streams"))
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
            parked_seq=inst.get("parked_seq", 0),
            parked_key=inst.get("parked_key", ""),
            history_generation=inst.get("history_generation", 1),
        ),
        events=events,
        signals=signals,
        archived=archived,
        streams=streams,
    )


_STREAM = {"key": str, "seq": int, "value": object, "attempt": object}


def _parse_streams(items: list[Any]) -> list[RecordedStreamEntry]:
    """Strictly decode the ``streams`` section: each (key, seq) once, attempt int or null."""
    out: list[RecordedStreamEntry] = []
    seen: set[tuple[str, int]] = set()
    for index, raw in enumerate(items):
        where = f"streams[{index}]"
        entry = _check_object(raw, where, _STREAM, {"key", "seq", "value"}, {})
        attempt = entry.get("attempt")
        if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
            raise _fail(f"field {where}.attempt must be int or null")
        identity = (entry["key"], entry["seq"])
        if identity in seen:
            raise _fail(f"{where} repeats seq {identity[1]} of stream {identity[0]!r}")
        seen.add(identity)
        out.append(RecordedStreamEntry(entry["key"], entry["seq"], entry["value"], attempt))
    return out


_ARCHIVED = {**_EVENT, "generation": int, "archived_at": str}


def _parse_archived(items: list[Any]) -> list[RecordedArchivedEvent]:
    """Strictly decode the ``archived`` section, as the events are."""
    out: list[RecordedArchivedEvent] = []
    seen: set[tuple[int, str]] = set()
    for index, raw in enumerate(items):
        where = f"archived[{index}]"
        required = {*_EVENT_REQUIRED, "generation", "archived_at"}
        event = _check_object(raw, where, _ARCHIVED, required, _ZERO_EVENT)
        if event.get("data_type", "json") not in ("json", ""):
            raise _fail(f"field {where}.data_type is unsupported")
        if event.get("binary") is not None:
            raise _fail(f"field {where}.binary is unsupported")
        identity = (event["generation"], event["key"])
        if identity in seen:
            raise _fail(f"{where} repeats key {event['key']!r} in generation {identity[0]}")
        seen.add(identity)
        out.append(
            RecordedArchivedEvent(
                seq=event["seq"],
                key=event["key"],
                command=event["command"],
                event_type=event["event_type"],
                data=event.get("data", ABSENT),
                reservation=event.get("reservation", ABSENT),
                delivered_seq=event.get("delivered_seq", 0),
                generation=event["generation"],
                archived_at=event["archived_at"],
            )
        )
    return out
