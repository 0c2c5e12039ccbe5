"""Results: read an instance's outcome now, or wait for its close (sync and async).

A wait subscribes to the instance's close on the store's wake-up bus before it
first reads, so a close in between is not missed; workers of this process, and
``LISTEN`` on PostgreSQL, cut it short. ``WAIT_POLL_INTERVAL`` is the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from asgiref.sync import sync_to_async

from ..conf import get_settings
from ..engine.codec import error_from_envelope
from ..handles import WorkflowResult
from ..models import WorkflowStatus
from ..registry import get_workflow
from ..storage import Store
from ..storage.wakeups import Waker
from ..worker.handoff import running_here
from .base import client_store, known_id

__all__ = [
    "WorkflowResult",
    "aget_workflow_result",
    "await_workflow",
    "get_workflow_result",
    "wait_workflow",
]


def _result(
    instance_id: str, status: str, output_text: str | None, error_text: str | None
) -> WorkflowResult:
    output = None
    error: BaseException | None = None
    codec = client_store().codec
    if status == WorkflowStatus.COMPLETED and output_text is not None:
        output = _typed_output(instance_id, codec.decode(output_text))
    elif error_text:
        error = error_from_envelope(json.loads(error_text), codec)
    return WorkflowResult(instance_id, status, output, error)


def _typed_output(instance_id: str, output: Any) -> Any:
    """With a PAYLOAD_CONVERTER, the output as the registered workflow's return annotation
    says (one more read, of the workflow's name); else the JSON as it is."""
    settings = get_settings()
    if settings.payload_converter is None:
        return output
    name = client_store().operator_reads.workflow_name(instance_id)
    definition = None if name is None else get_workflow(name)
    if definition is None:
        return output
    return client_store().codec.result(definition.fn, output)


def get_workflow_result(instance_id: str) -> WorkflowResult:
    """Read an instance's current status and result without waiting."""
    return _result(instance_id, *client_store().get_result_row(known_id(instance_id)))


aget_workflow_result = sync_to_async(get_workflow_result)


def wait_workflow(instance_id: str, timeout: float | None = None) -> WorkflowResult:
    """Wait until the instance is closed and return its result.

    Raises ``TimeoutError`` when ``timeout`` seconds pass first. Wake-ups from
    workers in this process cut the wait short; ``WAIT_POLL_INTERVAL`` is the
    fallback polling interval.
    """
    known_id(instance_id)
    store = client_store()
    poll = get_settings().wait_poll_interval
    deadline = None if timeout is None else time.monotonic() + timeout
    waker = Waker()
    topic = f"closed:{instance_id}"
    store.bus.subscribe(topic, waker)
    if store.db.notify_enabled:
        from ..storage.postgresql.listener import ensure_listener

        ensure_listener(store.db.listen_alias, store.bus)
    # An execution handed to a worker of this process is running: no need to read
    # the row first (its close wakes this waiter; subscribed above, so none is missed).
    read = not running_here(instance_id)
    try:
        while True:
            if read:
                result = get_workflow_result(instance_id)
                if result.status != WorkflowStatus.RUNNING:
                    return result
            read = True
            wait = poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"workflow {instance_id!r} still running after {timeout} seconds"
                    )
                wait = min(wait, remaining)
            waker.wait(wait)
    finally:
        store.bus.unsubscribe(topic, waker)


class _LoopWaker(Waker):
    """A bus waker that wakes a coroutine: sets an asyncio.Event from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.event = asyncio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self.event.set)


def _subscribe_closed(instance_id: str, waker: Waker) -> tuple[Store, bool]:
    """Subscribe ``waker`` to the instance's close; return the store and whether to read."""
    store = client_store()
    store.bus.subscribe(f"closed:{instance_id}", waker)
    if store.db.notify_enabled:
        from ..storage.postgresql.listener import ensure_listener

        ensure_listener(store.db.listen_alias, store.bus)
    return store, not running_here(instance_id)


async def await_workflow(instance_id: str, timeout: float | None = None) -> WorkflowResult:
    """Async twin of :func:`wait_workflow`, woken the same way, without blocking the loop.

    The close of the instance wakes it (from workers in this process, and through
    ``LISTEN`` on PostgreSQL); ``WAIT_POLL_INTERVAL`` is the fallback poll.
    """
    poll = get_settings().wait_poll_interval
    deadline = None if timeout is None else time.monotonic() + timeout
    waker = _LoopWaker(asyncio.get_running_loop())
    # Subscribed before the first read, so a close in between is not missed.
    store, read = await sync_to_async(_subscribe_closed)(instance_id, waker)
    try:
        while True:
            if read:
                result = await aget_workflow_result(instance_id)
                if result.status != WorkflowStatus.RUNNING:
                    return result
            read = True
            wait = poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"workflow {instance_id!r} still running after {timeout} seconds"
                    )
                wait = min(wait, remaining)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker.event.wait(), wait)
            waker.event.clear()
    finally:
        store.bus.unsubscribe(f"closed:{instance_id}", waker)
