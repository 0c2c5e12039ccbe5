"""Patches: change workflow code while instances recorded under the old code still run.

``ctx.patched(patch_id)`` records a *marker* command when it runs live and
returns True (the new code path). In replay it returns True only when the
command recorded at its position is that marker, and consumes the position;
when history holds another command there, or the recorded run got no further
than this position, it returns False and consumes nothing, so a history
recorded before the patch stays aligned and its instance takes the old path.

"Got no further" needs the position where the previous execution parked: a
wait that suspends (a receive, a condition) records nothing, so history alone
cannot say whether the old code reached the patch point. The engine keeps that
position per instance (:attr:`ExecutionSnapshot.parked_seq`); a call at or
before it is replay, one after it is live.

``ctx.deprecate_patch(patch_id)`` is the step after every old-path instance has
closed: it consumes the marker when one is recorded at its position, records
nothing live and always returns True, so histories with and without the marker
both replay. A patch id used twice in one run is a :class:`NondeterminismError`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

from .events import CMD_PATCH, EV_PATCH_MARKER, HistoryRow
from .identifiers import instance_id_problem

if TYPE_CHECKING:
    from .execution import Execution

__all__ = [
    "PATH_DEPRECATED",
    "PATH_NEW",
    "PATH_OLD",
    "check_patch_id",
    "deprecate_patch",
    "marker_patch_id",
    "patched",
]

# How a run went through a patch (``Execution.patches``): with its marker (the new
# path), without it (the old path), or through deprecate_patch() with no marker.
PATH_NEW = "new"
PATH_OLD = "old"
PATH_DEPRECATED = "deprecated"


def check_patch_id(patch_id: object) -> str:
    """Return ``patch_id`` if it can name a patch (1 to 255 characters, no control
    characters); else raise ``TypeError`` or ``ValueError``."""
    if not isinstance(patch_id, str):
        raise TypeError(f"a patch id must be a string, not {type(patch_id).__name__}")
    problem = instance_id_problem(patch_id, "a patch id")
    if problem is not None:
        raise ValueError(problem)
    return patch_id


def marker_patch_id(row: HistoryRow) -> str | None:
    """The patch id a recorded row marks, or None when it is not a patch marker."""
    if row.command != CMD_PATCH or row.data is None:
        return None
    try:
        value = json.loads(row.data)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _take(execution: Execution, patch_id: str, what: str) -> None:
    execution.check_command(what)
    check_patch_id(patch_id)
    if patch_id in execution.patches:
        raise execution.nondeterminism(
            f"{what} used patch id {patch_id!r} a second time in one run",
            key=patch_id,
            expected="one use of each patch id",
            actual=CMD_PATCH,
        )


def _recorded_here(execution: Execution, patch_id: str) -> bool | None:
    """True when the next position holds this patch's marker, False when it holds
    another command, None when nothing is recorded there."""
    row = execution.by_seq.get(execution.seq + 1)
    if row is None:
        return None
    return marker_patch_id(row) == patch_id


def _consume(execution: Execution, patch_id: str) -> None:
    execution.next_position(None, CMD_PATCH, f"patch:{patch_id}")
    execution.patches[patch_id] = PATH_NEW


def patched(execution: Execution, patch_id: str) -> bool:
    """Return True on the new code path (recording its marker live), False on the old."""
    _take(execution, patch_id, "patched()")
    recorded = _recorded_here(execution, patch_id)
    if recorded is True:
        _consume(execution, patch_id)
        return True
    # The furthest position earlier executions reached: recorded, or parked at.
    boundary = max(execution.max_recorded_seq, execution.snapshot.parked_seq)
    if recorded is False or execution.seq + 1 <= boundary:
        # The recorded run issued something else here, or went no further than here:
        # it ran the old code. Nothing is consumed, so its history stays aligned.
        execution.patches[patch_id] = PATH_OLD
        return False
    seq, key = execution.next_position(None, CMD_PATCH, f"patch:{patch_id}")
    if execution.readonly:
        raise execution.suspend(f"patch marker {patch_id!r} is not recorded")
    # Delivered at its own position: a marker is no arrival for a later wait to deliver.
    execution.record(
        HistoryRow(key, seq, CMD_PATCH, EV_PATCH_MARKER, json.dumps(patch_id), None, seq)
    )
    execution.patches[patch_id] = PATH_NEW
    return True


def deprecate_patch(execution: Execution, patch_id: str) -> Literal[True]:
    """Consume this patch's marker when it is recorded here; record nothing live."""
    _take(execution, patch_id, "deprecate_patch()")
    if _recorded_here(execution, patch_id):
        _consume(execution, patch_id)
    else:
        execution.patches[patch_id] = PATH_DEPRECATED
    return True
