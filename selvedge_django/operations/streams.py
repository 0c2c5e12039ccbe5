"""Reading streams: a generator (and an async iterator) of an instance's stream entries.

A reader subscribes to the instance's stream topic (and its close) before its first
read, so an entry committed in between is not missed; the writers' wake-ups (workers of this
process, and ``LISTEN`` on PostgreSQL through the process's one shared listener,
as :func:`~selvedge_django.wait_workflow` uses) cut each wait short, and
``WAIT_POLL_INTERVAL`` is the fallback poll (SQLite across processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async

from ..conf import get_settings
from ..engine.identifiers import check_stream_key
from ..storage import Store
from ..storage.streams import StoredEntry, StreamRead
from ..storage.wakeups import Waker, closed_topic, stream_topic
from .base import client_store, known_id
from .results import _LoopWaker

__all__ = ["READ_BATCH", "StreamEntry", "aread_stream", "read_stream"]

#: The most entries one read of a stream fetches.
READ_BATCH = 500


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a stream, as readers get it.

    ``seq`` numbers the stream's entries from 1 in the order they were written;
    ``attempt`` is the activity attempt that wrote the entry (None: the workflow
    itself wrote it) and ``activity_id`` that activity's history key, so a page
    can tell a retried attempt's entries from the failed attempt's.
    """

    seq: int
    value: Any
    attempt: int | None
    written_at: datetime
    activity_id: str | None = None


def _entry(store: Store, stored: StoredEntry) -> StreamEntry:
    value = store.codec.decode(stored.value)
    return StreamEntry(stored.seq, value, stored.attempt, stored.written_at, stored.activity_id)


def _check(instance_id: str, key: str, after: int, timeout: float | None) -> tuple[str, str]:
    instance_id = known_id(instance_id)
    key = check_stream_key(key)
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after must be a whole number of at least 0, not {after!r}")
    if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
        raise ValueError(f"timeout must be None or at least 0 seconds, not {timeout!r}")
    return instance_id, key


def _topics(instance_id: str) -> tuple[str, str]:
    """What wakes a reader: a write to (or close of) a stream, and the instance's close."""
    return stream_topic(instance_id), closed_topic(instance_id)


def _subscribe(instance_id: str, waker: Waker) -> Store:
    store = client_store()
    for topic in _topics(instance_id):
        store.bus.subscribe(topic, waker)
    if store.db.notify_enabled:
        from ..storage.postgresql.listener import ensure_listener

        ensure_listener(store.db.listen_alias, store.bus)
    return store


def _ended(read: StreamRead) -> bool:
    """Whether a read saw the whole rest of a closed stream."""
    return read.closed and len(read.entries) < READ_BATCH


def _timeout_error(instance_id: str, key: str, timeout: float | None) -> TimeoutError:
    return TimeoutError(f"no new entry in stream {key!r} of {instance_id!r} for {timeout} seconds")


def read_stream(
    instance_id: str, key: str, *, after: int = 0, timeout: float | None = None
) -> Iterator[StreamEntry]:
    """Yield the entries of the instance's stream ``key`` after seq ``after``, in order.

    Waits for new entries until the stream is closed (``ctx.close_stream()``, or the
    instance closed), then ends; raises ``TimeoutError`` once ``timeout`` seconds
    pass with nothing new. An unknown instance raises :class:`WorkflowNotFound`
    (at the first ``next()``). To resume after a disconnect, pass the last seq
    read as ``after``.
    """
    instance_id, key = _check(instance_id, key, after, timeout)
    poll = get_settings().wait_poll_interval
    waker = Waker()
    store = _subscribe(instance_id, waker)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = store.streams.read(instance_id, key, after, READ_BATCH)
            for stored in found.entries:
                after = stored.seq
                yield _entry(store, stored)
            if _ended(found):
                return
            if found.entries:
                if timeout is not None:
                    deadline = time.monotonic() + timeout
                continue
            wait = poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timeout_error(instance_id, key, timeout)
                wait = min(wait, remaining)
            waker.wait(wait)
    finally:
        for topic in _topics(instance_id):
            store.bus.unsubscribe(topic, waker)


async def aread_stream(
    instance_id: str, key: str, *, after: int = 0, timeout: float | None = None
) -> AsyncIterator[StreamEntry]:
    """Async twin of :func:`read_stream` for async views: ``async for entry in ...``.

    Waits without blocking the event loop, woken the same way.
    """
    instance_id, key = _check(instance_id, key, after, timeout)
    poll = get_settings().wait_poll_interval
    waker = _LoopWaker(asyncio.get_running_loop())
    store = await sync_to_async(_subscribe)(instance_id, waker)
    read = sync_to_async(store.streams.read)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            waker.event.clear()
            found = await read(instance_id, key, after, READ_BATCH)
            for stored in found.entries:
                after = stored.seq
                yield _entry(store, stored)
            if _ended(found):
                return
            if found.entries:
                if timeout is not None:
                    deadline = time.monotonic() + timeout
                continue
            wait = poll
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _timeout_error(instance_id, key, timeout)
                wait = min(wait, remaining)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker.event.wait(), wait)
    finally:
        for topic in _topics(instance_id):
            store.bus.unsubscribe(topic, waker)
