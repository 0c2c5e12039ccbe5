"""The old home of portable histories, replay checks and queries.

The format and its parser are in :mod:`selvedge_django.engine.portable`, the
read-only replay in :mod:`selvedge_django.engine.replay`, and the operations
(export, replay checks, queries) in :mod:`selvedge_django.operations.history`.
These names stay importable from here.
"""

from __future__ import annotations

from .engine.portable import (
    ABSENT,
    FORMAT,
    RecordedEvent,
    RecordedHistory,
    RecordedInstance,
    RecordedSignal,
    parse_history,
)
from .engine.replay import ReplayRuntime
from .operations.history import (
    REDACTED,
    export_history,
    query,
    redacted,
    replay_history,
    replay_instance,
)

__all__ = [
    "ABSENT",
    "FORMAT",
    "REDACTED",
    "RecordedEvent",
    "RecordedHistory",
    "RecordedInstance",
    "RecordedSignal",
    "ReplayRuntime",
    "export_history",
    "parse_history",
    "query",
    "redacted",
    "replay_history",
    "replay_instance",
]
