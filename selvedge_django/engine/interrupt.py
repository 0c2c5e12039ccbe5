"""Interrupt Python code that runs past a deadline: a trace function checked as it runs.

A query handler runs in the caller's thread (a request's, in the admin), and Python
cannot stop a thread from outside. :class:`Deadline` installs a trace function
(``sys.settrace``, this thread only) for the code it guards: every frame called
from there on is traced opcode by opcode, and once the monotonic deadline has
passed the next traced opcode raises :class:`DeadlinePassed`, so a ``while True:
pass`` stops too. It is a ``BaseException``, so ``except Exception`` in the guarded
code does not swallow it.

What cannot be interrupted: a blocking call into C (``time.sleep``, a socket read,
a lock's ``acquire``, a database query, a long regular expression match) runs until
it returns, since no Python opcode runs meanwhile; code that catches
``BaseException`` and carries on, since CPython drops a trace function that
raised (the guard notices on exit: :attr:`Deadline.fired`); and other threads
the code starts. Traced code runs several times slower, so the guard is for
short calls such as query handlers.

A trace function installed before (coverage, a debugger) keeps receiving its
events while the guard is on, and is restored afterwards.
"""

from __future__ import annotations

import sys
import time
from types import FrameType, TracebackType
from typing import Any

__all__ = ["Deadline", "DeadlinePassed"]

TraceFunction = Any  # sys.settrace's callables: (frame, event, arg) -> trace function or None


class DeadlinePassed(BaseException):
    """Raised into guarded code whose deadline has passed (never escapes a guard's user)."""


class Deadline:
    """``with Deadline(deadline):`` interrupts the block's Python code at ``deadline``
    (a ``time.monotonic()`` value) with :class:`DeadlinePassed`.

    ``fired`` tells afterwards whether it was raised, even if the code swallowed it.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self._active = False
        self._previous: TraceFunction = None
        self._tracer: TraceFunction = self._call  # one bound method, compared by identity

    def __enter__(self) -> Deadline:
        self._previous = sys.gettrace()
        self._active = True
        sys.settrace(self._tracer)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._active = False
        sys.settrace(self._previous)

    def _check(self) -> None:
        if time.monotonic() >= self.deadline:
            self.fired = True
            raise DeadlinePassed

    def _call(self, frame: FrameType, event: str, arg: Any) -> TraceFunction:
        """The global trace function: called for each new frame ("call")."""
        previous = self._previous
        chained = previous(frame, event, arg) if previous is not None else None
        if not self._active:
            return chained
        if sys.gettrace() is not self._tracer:
            # A tracer may reinstall itself when called for a "call" (coverage's C
            # tracer does): put the guard back, the tracer keeps being chained.
            sys.settrace(self._tracer)
        self._check()
        frame.f_trace_opcodes = True
        return self._local(chained)

    def _local(self, chained: TraceFunction) -> TraceFunction:
        """A frame's trace function; ``chained`` is the previous tracer's for that frame."""

        def trace(frame: FrameType, event: str, arg: Any) -> TraceFunction:
            nonlocal chained
            if event != "opcode" and chained is not None:
                chained = chained(frame, event, arg)
            if not self._active:
                # Defensive: a frame still traced by the guard after it ended is handed
                # back to the previous tracer untouched.
                frame.f_trace_opcodes = False
                return chained
            self._check()
            return trace

        return trace
