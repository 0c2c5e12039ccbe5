"""Stream commands: ``ctx.write_stream()`` and ``ctx.close_stream()``.

Each is a command with a history row, written live together with its effect (the
entry, the close) in one fenced transaction, so a replay, on this worker or
another, finds the row and writes nothing. A write's row records the entry's
``seq``, or why the store refused it (a closed stream, an instance at
``MAX_STREAM_ENTRIES``): the refusal is raised live and again in every replay, so
workflow code that catches it takes the same path each time. A write to a stream
this run closed is refused before any position is taken, live and in replay alike.
"""

from __future__ import annotations

import json
from typing import Any

from .. import exceptions as exc
from .events import (
    CMD_STREAM,
    CMD_STREAM_CLOSE,
    EV_STREAM_REJECTED,
    HistoryRow,
    reservation_of,
)
from .execution import Execution
from .identifiers import check_stream_key

__all__ = ["close_stream", "write_stream"]


def write_stream(execution: Execution, key: str, value: Any) -> int:
    """Append ``value`` to the instance's stream ``key``; return the entry's seq."""
    execution.check_command("write_stream()")
    key = check_stream_key(key)
    text = execution.runtime.codec.encode(value, f"value of stream {key!r}")
    if key in execution.closed_streams:
        raise exc.StreamClosed(execution.instance_id, key)
    seq, history_key = execution.next_position(None, CMD_STREAM, "write_stream")
    recorded = execution.history.get(history_key)
    if recorded is None:
        if execution.readonly:
            raise execution.suspend(f"stream write {history_key!r} is not recorded")
        row = HistoryRow(
            history_key,
            seq,
            CMD_STREAM,
            reservation=json.dumps({"stream": key}, ensure_ascii=False),
        )
        fence = execution.fence
        assert fence is not None
        store = execution.runtime.store
        stored = execution.guarded(lambda: store.write_stream(fence, row, key, text))
        recorded = execution.check_stored(history_key, stored, CMD_STREAM)
    else:
        _check_recorded_key(execution, recorded, key)
    return _outcome(execution, recorded, key)


def close_stream(execution: Execution, key: str) -> None:
    """Close the instance's stream ``key``: readers end, later writes raise StreamClosed."""
    execution.check_command("close_stream()")
    key = check_stream_key(key)
    seq, history_key = execution.next_position(None, CMD_STREAM_CLOSE, "close_stream")
    recorded = execution.history.get(history_key)
    if recorded is None:
        if execution.readonly:
            raise execution.suspend(f"stream close {history_key!r} is not recorded")
        row = HistoryRow(
            history_key,
            seq,
            CMD_STREAM_CLOSE,
            reservation=json.dumps({"stream": key}, ensure_ascii=False),
        )
        fence = execution.fence
        assert fence is not None
        store = execution.runtime.store
        stored = execution.guarded(lambda: store.close_stream(fence, row, key))
        execution.check_stored(history_key, stored, CMD_STREAM_CLOSE)
    else:
        _check_recorded_key(execution, recorded, key)
    execution.closed_streams.add(key)


def _check_recorded_key(execution: Execution, recorded: HistoryRow, key: str) -> None:
    recorded_key = reservation_of(recorded).get("stream")
    if recorded_key is not None and recorded_key != key:
        raise execution.nondeterminism(
            f"command {recorded.key!r} recorded stream {recorded_key!r}, code issued {key!r}",
            key=recorded.key,
            expected=str(recorded_key),
            actual=key,
        )


def _outcome(execution: Execution, row: HistoryRow, key: str) -> int:
    data = json.loads(row.data) if row.data else {}
    if row.event_type == EV_STREAM_REJECTED:
        message = str(data.get("message", "")) or None
        if data.get("error") == "StreamLimitExceeded":
            raise exc.StreamLimitExceeded(execution.instance_id, message=message)
        raise exc.StreamClosed(execution.instance_id, key, message=message)
    return int(data["seq"])
