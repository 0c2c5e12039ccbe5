"""The leftovers check: recorded commands past the position where workflow code stopped."""

from __future__ import annotations

from .. import exceptions as exc
from .events import CMD_ACTIVITY, CMD_CHILD, CMD_SLEEP, HistoryRow

__all__ = ["leftover_divergence"]

_VERBS = {
    "return": "returned",
    "raise": "raised",
    "cancel": "was cancelled",
    "wait": "waited",
    "continue": "continued as new",
}


def leftover_divergence(
    by_seq: dict[int, HistoryRow],
    seq: int,
    instance_id: str,
    ending: str,
    error: BaseException | None,
) -> exc.NondeterminismError | None:
    """The divergence of code that stopped at position ``seq`` before recorded commands.

    ``ending`` says how the code stopped: ``return``, ``continue``, ``raise``,
    ``cancel`` or ``wait``. Only rows with a command position count (the close
    record has none). Code that returned, continued as new, raised or was
    cancelled issues nothing more, so every recorded command after its last
    position is a leftover: the recorded run went on where this code no longer
    does. Code that waits may still issue commands once the wait completes, so
    the reservations the recorded run issued but had no outcome for yet
    (futures it had not awaited) are not leftovers of a wait; anything else
    recorded after the wait (an observation, an outcome) is something this code
    could not have recorded before its wait completes. None: no leftover.
    """
    leftover = [
        row
        for position, row in by_seq.items()
        if position > seq
        and not (
            ending == "wait"
            and row.command in (CMD_ACTIVITY, CMD_SLEEP, CMD_CHILD)
            and not row.has_value
        )
    ]
    if not leftover:
        return None
    first = min(leftover, key=lambda r: r.seq or 0)
    raised = f" {type(error).__name__} ({error})" if error is not None else ""
    at = f"after command {seq}" if seq else "before its first command"
    return exc.NondeterminismError(
        f"workflow {_VERBS[ending]}{raised} {at}, before recorded command "
        f"{first.seq} ({first.command} {first.key!r})",
        instance_id=instance_id,
        key=first.key,
        expected=first.command,
        actual=ending,
    )
