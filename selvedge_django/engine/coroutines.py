"""Running ``async def`` activities: an event loop of their own on the attempt's thread.

A worker runs attempts on plain threads. Calling an async activity returns a
coroutine; :func:`call_activity` runs it to completion on a new event loop in
the calling thread (the attempt's context, so ``activity_info()`` and
``heartbeat()`` see the attempt), and cancels it at its next ``await`` once the
attempt is stopped: deadline passed, claim lost, workflow cancelled, shutdown.
The cancellation comes back as :class:`ActivityCancelled`, as from a heartbeat.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..exceptions import ActivityCancelled

if TYPE_CHECKING:
    from .activity import AttemptState

__all__ = ["call_activity", "is_async_callable", "run_coroutine"]

# How often a running coroutine's attempt is checked for a stop (a stop sets no
# event the loop could wait on: a deadline is only noticed when looked at).
_WATCH_INTERVAL = 0.02


def is_async_callable(fn: object) -> bool:
    """True for ``async def`` functions (and callables whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def call_activity(fn: Callable[[Any], Any], value: Any, state: AttemptState | None) -> Any:
    """Call an activity function; run the coroutine it returns, if it does, to its result."""
    result = fn(value)
    if inspect.iscoroutine(result):
        return run_coroutine(result, state)
    return result


def run_coroutine(coro: Coroutine[Any, Any, Any], state: AttemptState | None) -> Any:
    """Run ``coro`` on a new event loop in this thread and return its result.

    Called from a thread that already runs an event loop (a test driving a
    worker from async code), it runs on a helper thread instead and waits.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_supervised(coro, state))
    outcome: list[Any] = []
    failure: list[BaseException] = []
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome.append(context.run(asyncio.run, _supervised(coro, state)))
        except BaseException as error:
            failure.append(error)

    helper = threading.Thread(target=run, name="selvedge-async-activity", daemon=True)
    helper.start()
    helper.join()
    if failure:
        raise failure[0]
    return outcome[0]


async def _supervised(coro: Coroutine[Any, Any, Any], state: AttemptState | None) -> Any:
    task = asyncio.ensure_future(coro)
    if state is None:
        return await task
    watcher = asyncio.ensure_future(_watch(state, task))
    try:
        return await task
    except asyncio.CancelledError:
        if state.cancelled:
            raise ActivityCancelled(f"activity attempt stopped: {state.cancel_reason}") from None
        raise
    finally:
        watcher.cancel()


async def _watch(state: AttemptState, task: asyncio.Future[Any]) -> None:
    while not task.done():
        if state.cancelled:
            task.cancel()
            return
        await asyncio.sleep(_WATCH_INTERVAL)
