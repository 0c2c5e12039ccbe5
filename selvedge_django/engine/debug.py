"""A replay to step through: the real workflow code against its real history, read-only.

:func:`debug_replay` runs the code as a query does (no store, no activity, no
lease, no hook: every recorded command returns its recorded value, and the first
unrecorded one stops the replay), and calls ``breakpoint()`` once, just before
the code issues the command at the chosen key (or position). Whatever
``sys.breakpointhook`` is (pdb by default, an IDE's hook, a ``PYTHONBREAKPOINT``
callable) decides what happens there; ``PYTHONBREAKPOINT=0`` turns it off.

The stop is in :func:`stop_before_command`, a few frames under the workflow code:
its locals name the command (``seq``, ``key``, ``command``, the ``recorded`` row)
and ``frames_up`` says how many frames up the workflow's own frame is (``up N`` in
pdb; an IDE shows it in the call stack). Stepping on from there (``next`` in the
workflow's frame) runs the command with its recorded value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from .. import exceptions as exc
from .context import WorkflowContext
from .events import HistoryRow
from .execution import Execution
from .portable import RecordedHistory
from .replay import ReplayRuntime, position_of, snapshot_of

__all__ = ["DebugReplay", "debug_replay", "stop_before_command"]

_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep


@dataclass
class DebugReplay:
    """How a debugged replay went.

    ``stopped`` is True when the code reached the command at ``stop_at`` (and the
    breakpoint hook was called there, once); ``outcome`` is ``"completed"``,
    ``"failed"``, ``"cancelled"``, ``"suspended"`` (it reached the end of the
    recorded history) or ``"continued"``; ``output`` and ``error`` are what the
    code returned or raised; ``last_key`` is the key of the last command it issued;
    ``query_handlers`` are the names registered where it stopped.
    """

    instance_id: str
    workflow_name: str
    stop_at: str | int | None
    stopped: bool
    outcome: str
    output: Any = None
    error: BaseException | None = None
    last_key: str = ""
    query_handlers: list[str] = field(default_factory=list)


def _workflow_frames_up(frame: FrameType | None) -> int:
    """How many frames above ``frame`` the first one outside this package is."""
    count = 0
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        count += 1
    return count


def stop_before_command(seq: int, key: str, command: str, recorded: HistoryRow | None) -> None:
    """Call ``breakpoint()``: the workflow code is about to issue command ``seq`` (``key``).

    In pdb, ``up {frames_up}`` (or the frame named after your workflow function in
    ``where``) is your code, on the line that issues the command; ``next`` there
    steps over it with its recorded value.
    """
    frames_up = _workflow_frames_up(sys._getframe(1)) + 1
    print(
        f"selvedge: replay stopped before command {seq} ({command} {key!r}); "
        f"your workflow code is {frames_up} frames up (pdb: up {frames_up})",
        file=sys.stderr,
    )
    breakpoint()  # the point of a debug replay


def debug_replay(
    history: RecordedHistory,
    fn: Callable[[Any, Any], Any],
    runtime: ReplayRuntime,
    *,
    stop_at: str | int | None = None,
) -> DebugReplay:
    """Replay ``fn`` read-only against ``history``, stopping in the debugger at ``stop_at``.

    ``stop_at`` is a history key or a command position; one the history does not
    record raises :class:`HistoryKeyNotFound` before any code runs. The stop
    happens once, at the position of the recorded command, even when the code now
    issues a different command there (the place to look at a divergence).
    """
    inst = history.instance
    stop_seq = None if stop_at is None else position_of(history, stop_at)
    if stop_at is not None and stop_seq is None:
        raise exc.HistoryKeyNotFound(
            inst.instance_id,
            stop_at,
            f"{stop_at!r} is the close record of {inst.instance_id!r}, not a command the "
            "workflow code issues: stop at one of its commands",
        )
    execution = Execution(runtime, snapshot_of(history), None, readonly=True)
    stopped = False

    def before_command(seq: int, key: str, command: str) -> None:
        nonlocal stopped
        if stopped or stop_at is None:
            return
        if seq == stop_seq:
            stopped = True
            stop_before_command(seq, key, command, execution.by_seq.get(seq))

    execution.before_command = before_command
    outcome = execution.run(fn, WorkflowContext(execution, execution.root_scope))
    return DebugReplay(
        instance_id=inst.instance_id,
        workflow_name=inst.workflow_name,
        stop_at=stop_at,
        stopped=stopped,
        outcome=outcome.kind,
        output=outcome.output,
        error=outcome.error,
        last_key=execution.last_key,
        query_handlers=sorted(execution.query_handlers),
    )
