"""Sagas: compensations that undo what a block did when the block fails.

``with ctx.saga() as saga:`` opens the block; ``saga.add_compensation(activity,
input)`` remembers an activity that undoes the step just done. Adding writes
nothing: it is the code's own state, rebuilt by every replay like any variable.
When the block raises (an error, or a cancellation of the workflow or of a
scope), the compensations added so far are issued as ordinary activities on a
detached context, so the durable cancel request does not stop them, in reverse
order (or all at once with ``parallel=True``), each with its own retry policy.
They are recorded like every command: a replay after a crash or a lost lease
returns the outcomes of those already done and carries on with the next one.

Then the block's error propagates; a compensation that fails for good (its
retries exhausted, a non-retryable error) raises :class:`CompensationError`
instead, carrying both errors. With ``continue_on_error=False`` (the default)
the sequence stops at that compensation; with ``True`` the rest still run and
the error carries every failure. A block that completes runs none. An
execution that unwinds for the engine's own reasons (a suspension, a
continue-as-new, a sticky failure such as a nondeterminism) compensates
nothing: the code is not failing, it is being stopped, and a later replay
decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, overload

from .. import exceptions as exc
from .execution import Execution
from .options import ActivityOptions

__all__ = ["CompensationActivity", "Saga"]

InT = TypeVar("InT")
InT_contra = TypeVar("InT_contra", contravariant=True)


class CompensationActivity(Protocol[InT_contra]):
    """What ``add_compensation`` takes: a registered activity of one ``InT`` input."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[[InT_contra], Any]: ...


@dataclass(frozen=True)
class _Compensation:
    activity: Any
    input: Any
    options: ActivityOptions | None


class Saga:
    """A block whose failure runs the compensations added inside it, last first."""

    def __init__(
        self,
        execution: Execution,
        detached: Callable[[], Any],
        *,
        parallel: bool = False,
        continue_on_error: bool = False,
    ) -> None:
        self._execution = execution
        self._detached = detached
        self.parallel = bool(parallel)
        self.continue_on_error = bool(continue_on_error)
        self._compensations: list[_Compensation] = []
        self._open = False

    def __repr__(self) -> str:
        return f"<Saga compensations={len(self._compensations)} parallel={self.parallel}>"

    @property
    def compensations(self) -> int:
        """How many compensations were added so far."""
        return len(self._compensations)

    @overload
    def add_compensation(
        self,
        activity: CompensationActivity[None],
        input: None = None,
        *,
        options: ActivityOptions | None = None,
    ) -> None: ...

    @overload
    def add_compensation(
        self,
        activity: CompensationActivity[InT],
        input: InT,
        *,
        options: ActivityOptions | None = None,
    ) -> None: ...

    def add_compensation(
        self, activity: Any, input: Any = None, *, options: ActivityOptions | None = None
    ) -> None:
        """Remember ``activity(input)`` as the undoing of the step just done (writes nothing).

        ``activity`` is a registered activity (``@sv.activity``); ``input`` must be
        JSON-encodable now (a bad one raises ``TypeError`` or ``ValueError`` here,
        rather than when the compensation would run); ``options`` override the
        activity's defaults as for ``execute``. Write compensations to be idempotent:
        an attempt that a crash interrupts runs again.
        """
        execution = self._execution
        if not self._open:
            raise RuntimeError("add_compensation() is called inside the saga's with block")
        if execution.in_query:
            raise exc.QueryCommandError("add_compensation() called inside a query handler")
        if not callable(getattr(activity, "execute", None)) or not isinstance(
            getattr(activity, "name", None), str
        ):
            raise TypeError("add_compensation() takes a registered activity (@sv.activity)")
        if options is not None and not isinstance(options, ActivityOptions):
            raise TypeError("options must be an ActivityOptions")
        try:
            execution.runtime.codec.encode(input, f"input of compensation {activity.name!r}")
        except (exc.PayloadTooLarge, exc.PayloadTooDeep):
            raise
        except (TypeError, ValueError) as error:
            raise TypeError(f"compensation {activity.name!r} input is not JSON: {error}") from error
        self._compensations.append(_Compensation(activity, input, options))

    # -- the block ----------------------------------------------------------------------

    def __enter__(self) -> Saga:
        if self._open:
            raise RuntimeError("a saga's with block cannot be entered twice at once")
        self._open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        self._open = False
        compensations, self._compensations = self._compensations, []
        if error is None or not compensations or not self._compensates(error):
            return False
        failures = self._run(list(reversed(compensations)))
        if failures:
            raise exc.CompensationError(error, failures) from failures[0]
        return False

    def _compensates(self, error: BaseException) -> bool:
        """True when ``error`` is a failure of the code, not the engine stopping it."""
        execution = self._execution
        if (
            execution.fatal is not None
            or execution.suspension is not None
            or execution.continuation is not None
        ):
            return False
        return isinstance(error, Exception | exc.Cancelled)

    def _unless_stopped(self, failure: BaseException) -> None:
        """Re-raise when the engine stopped the execution: not a compensation's outcome."""
        if not self._compensates(failure):
            raise failure

    def _run(self, compensations: list[_Compensation]) -> list[BaseException]:
        """Issue the compensations on a detached context; return the final failures."""
        ctx = self._detached()
        failures: list[BaseException] = []
        if self.parallel:
            futures = [c.activity.execute_async(ctx, c.input, c.options) for c in compensations]
            for future in futures:
                try:
                    future.get(ctx)
                except (Exception, exc.Cancelled) as failure:
                    self._unless_stopped(failure)
                    failures.append(failure)
            return failures
        for compensation in compensations:
            try:
                compensation.activity.execute(ctx, compensation.input, compensation.options)
            except (Exception, exc.Cancelled) as failure:
                self._unless_stopped(failure)
                failures.append(failure)
                if not self.continue_on_error:
                    break
        return failures
