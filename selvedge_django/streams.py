"""Server-Sent Events of a stream: :func:`event_stream_response` for Django views.

Each stream entry becomes one event, ``id:`` being its ``seq`` and ``data:`` a
JSON object (``seq``, ``value``, ``attempt``, ``activity_id``, ``written_at``).
A browser's ``EventSource`` reconnects by itself after a dropped connection and
sends the last ``id`` it saw as the ``Last-Event-ID`` header: the response then
starts after that entry, so nothing is shown twice and nothing is missed. When
the stream is closed (or its instance), one ``event: end`` follows the last
entry and the response ends (call ``source.close()`` on it, or the browser
reconnects). While nothing new arrives, a comment line goes out every
``keepalive`` seconds so proxies keep the connection open.

Authorisation is the view's: call this only after checking that the user may see
the instance.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, StreamingHttpResponse

from .engine.identifiers import check_stream_key
from .operations.base import client_store, known_id
from .operations.streams import StreamEntry, aread_stream, read_stream

__all__ = ["event_stream_response"]

#: Seconds between keep-alive comments while a stream has nothing new.
KEEPALIVE = 15.0


def _event(entry: StreamEntry) -> str:
    data = json.dumps(
        {
            "seq": entry.seq,
            "value": entry.value,
            "attempt": entry.attempt,
            "activity_id": entry.activity_id,
            "written_at": entry.written_at,
        },
        cls=DjangoJSONEncoder,
        ensure_ascii=False,
    )
    return f"id: {entry.seq}\ndata: {data}\n\n"


_END = "event: end\ndata: {}\n\n"
# How long a browser waits before it reconnects (ms), sent first.
_RETRY = "retry: 1000\n\n"
_KEEPALIVE = ": keep-alive\n\n"


def _start_after(request: HttpRequest, after: int | None) -> int:
    header = request.headers.get("Last-Event-ID", "").strip()
    if header.isdigit():
        return int(header)
    return after or 0


def _events(
    instance_id: str, key: str, after: int, keepalive: float, until: float | None
) -> Iterator[str]:
    yield _RETRY
    while True:
        wait = keepalive if until is None else min(keepalive, until - time.monotonic())
        if wait <= 0:
            return  # the response's time is up: the browser reconnects after the last id
        try:
            for entry in read_stream(instance_id, key, after=after, timeout=wait):
                after = entry.seq
                yield _event(entry)
                if until is not None and time.monotonic() >= until:
                    return
        except TimeoutError:
            yield _KEEPALIVE
            continue
        yield _END
        return


async def _aevents(
    instance_id: str, key: str, after: int, keepalive: float, until: float | None
) -> AsyncIterator[str]:
    yield _RETRY
    while True:
        wait = keepalive if until is None else min(keepalive, until - time.monotonic())
        if wait <= 0:
            return
        try:
            async for entry in aread_stream(instance_id, key, after=after, timeout=wait):
                after = entry.seq
                yield _event(entry)
                if until is not None and time.monotonic() >= until:
                    return
        except TimeoutError:
            yield _KEEPALIVE
            continue
        yield _END
        return


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def event_stream_response(
    request: HttpRequest,
    instance_id: str,
    key: str,
    *,
    after: int | None = None,
    keepalive: float = KEEPALIVE,
    max_seconds: float | None = None,
) -> StreamingHttpResponse:
    """Return a ``text/event-stream`` response of the instance's stream ``key``.

    It starts after the request's ``Last-Event-ID`` header when it has one (a
    browser's reconnect), else after ``after`` (default: from the first entry).
    Works from sync views (a generator; each response holds a worker thread of a
    WSGI server while it lasts) and async views (an async iterator: under ASGI a
    waiting response holds no thread). From a sync view an unknown instance
    raises :class:`WorkflowNotFound` here, before the response starts; from an
    async view, check first (``await sv.adescribe(instance_id)``).

    ``keepalive`` is the seconds between comment lines while nothing is new.
    ``max_seconds`` bounds the response's life: it then ends without the ``end``
    event, and the browser reconnects (after a second) from its last id, so a
    WSGI worker is held for at most that long at a time.
    """
    start = _start_after(request, after)
    until = None if max_seconds is None else time.monotonic() + max_seconds
    content: Iterator[str] | AsyncIterator[str]
    if _in_event_loop():
        content = _aevents(instance_id, key, start, keepalive, until)
    else:
        client_store().streams.read(known_id(instance_id), check_stream_key(key), start, 0)
        if getattr(request, "scope", None) is not None:  # ASGI, from a sync view
            content = _aevents(instance_id, key, start, keepalive, until)
        else:
            content = _events(instance_id, key, start, keepalive, until)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response
