"""Step through a workflow's real code with its real history: ``replay_debug``.

The history comes from an instance (one snapshot read, as an export) or from an
exported ``selvedge.history/v1`` file, which needs no database at all; the replay
is the engine's read-only one (:mod:`selvedge_django.engine.debug`): recorded
values, no lease, no writes, no hooks, and one ``breakpoint()`` just before the
command at ``stop_at``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..engine.debug import DebugReplay, debug_replay
from ..engine.portable import RecordedHistory, parse_history
from .history import current_generation, replay_runtime, workflow_function

__all__ = ["DebugReplay", "load_history", "replay_debug"]


def load_history(source: RecordedHistory | str | bytes | os.PathLike[str]) -> RecordedHistory:
    """Return the history ``source`` names.

    A :class:`RecordedHistory` as is; a path (``pathlib.Path``) to an exported file,
    or the exported JSON itself (``bytes``, or ``str`` starting with ``{``), parsed
    strictly; any other ``str`` is an instance id, whose current generation is read
    from the database.
    """
    if isinstance(source, RecordedHistory):
        return source
    if isinstance(source, os.PathLike):
        return parse_history(Path(source).read_bytes())
    if isinstance(source, bytes):
        return parse_history(source)
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return parse_history(source)
    if isinstance(source, str):
        return current_generation(source)
    raise TypeError(
        "replay_debug() takes an instance id, a RecordedHistory, a path or exported JSON"
    )


def replay_debug(
    history_or_instance_id: RecordedHistory | str | bytes | os.PathLike[str],
    *,
    stop_at: str | int | None = None,
) -> DebugReplay:
    """Replay a workflow in this process with its recorded values, for a debugger.

    The registered code of the history's workflow runs read-only against the
    history (see :func:`load_history` for what ``history_or_instance_id`` may be):
    every recorded command returns its recorded value, nothing is written (no
    lease, no rows, no hooks), and the replay ends at the first command the history
    does not record. Set breakpoints in your IDE, or give ``stop_at`` (a history
    key such as ``"#3:shop.charge_payment"``, or a command position): ``breakpoint()``
    is called once, just before the workflow code issues that command, so pdb or
    your IDE (whatever ``sys.breakpointhook`` is) stops there with the real state.
    A ``stop_at`` the history does not record raises :class:`HistoryKeyNotFound`
    before any code runs. Returns a :class:`~selvedge_django.engine.debug.DebugReplay`.
    """
    history = load_history(history_or_instance_id)
    return debug_replay(history, workflow_function(history), replay_runtime(), stop_at=stop_at)
