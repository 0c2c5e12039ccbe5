"""A ``sys.breakpointhook`` that records where it was called instead of stopping.

``PYTHONBREAKPOINT=tests.breakpoint_recorder.record`` in a subprocess appends one
JSON line per call to the file ``SELVEDGE_BREAKPOINT_LOG`` names; in-process tests
install :func:`recorder` with ``monkeypatch.setattr(sys, "breakpointhook", ...)``.
Each record names the command the replay stopped before and what the workflow's
own frame (``frames_up`` above the stop) held at that moment.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def describe(stop: FrameType) -> dict[str, Any]:
    """What a user sees at the stop: the command, and the workflow frame's name and locals."""
    names = stop.f_locals
    frame: FrameType | None = stop
    for _ in range(names["frames_up"]):
        assert frame is not None
        frame = frame.f_back
    assert frame is not None
    return {
        "seq": names["seq"],
        "key": names["key"],
        "command": names["command"],
        "recorded": None if names["recorded"] is None else names["recorded"].key,
        "function": frame.f_code.co_name,
        # A copy: the replay goes on changing the workflow's lists after the stop.
        "locals": json.loads(
            json.dumps(
                {
                    name: value
                    for name, value in frame.f_locals.items()
                    if isinstance(value, str | int | list | dict)
                },
                default=str,
            )
        ),
    }


def recorder(calls: list[dict[str, Any]]) -> Callable[..., None]:
    """Return a breakpoint hook that appends a description of each stop to ``calls``."""

    def hook(*args: Any, **kwargs: Any) -> None:
        calls.append(describe(sys._getframe(1)))

    return hook


def record(*args: Any, **kwargs: Any) -> None:
    """The ``PYTHONBREAKPOINT`` target: one JSON line per stop in ``SELVEDGE_BREAKPOINT_LOG``."""
    entry = describe(sys._getframe(1))
    with open(os.environ["SELVEDGE_BREAKPOINT_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(entry, default=str) + "\n")
