"""Module-level django.tasks tasks for tests/integration/test_django_tasks.py.

Importable only where django.tasks (Django 6) or the django-tasks backport is; the
tests skip without either.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]

# What the tasks did, per call, in the worker threads of this process.
calls: list[tuple[str, Any]] = []
calls_lock = threading.Lock()


class Refused(Exception):
    """Listed in the test backend's non_retryable_errors."""


def record(name: str, value: Any) -> None:
    with calls_lock:
        calls.append((name, value))


@task()
def add(a: int, b: int) -> int:
    record("add", (a, b))
    return a + b


@task(queue_name="emails")
def send_email(to: str, *, subject: str = "") -> dict[str, str]:
    record("send_email", to)
    return {"to": to, "subject": subject}


@task()
def always_fails(message: str) -> None:
    record("always_fails", message)
    raise ValueError(message)


@task()
def refuses() -> None:
    record("refuses", None)
    raise Refused("no")


@task(takes_context=True)
def flaky(context: Any, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on``; returns the attempt that succeeded."""
    attempt = context.attempt
    record("flaky", attempt)
    if attempt < succeed_on:
        raise RuntimeError(f"attempt {attempt} fails")
    return attempt


@task(retry_policy={"max_attempts": 1})
def once(message: str) -> None:
    record("once", message)
    raise ValueError(message)


@task()
async def async_double(value: int) -> int:
    await asyncio.sleep(0)
    record("async_double", value)
    return value * 2


@task()
def noted(label: str) -> str:
    record("noted", label)
    return label


@task(takes_context=True)
def lost_once(context: Any, folder: str) -> int:
    """Attempt 1 fails; attempt 2 announces itself (a file in ``folder``) and hangs until
    its worker is killed; attempt 3 returns its number."""
    import os
    import time
    from pathlib import Path

    attempt = context.attempt
    if attempt == 1:
        raise RuntimeError("attempt 1 fails")
    if attempt == 2:
        Path(folder, f"attempt-2-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # killed long before
            time.sleep(0.05)
    return attempt


@task()
def marked(folder: str) -> str:
    """Leaves one file in ``folder`` per run (runs are counted across processes)."""
    import uuid
    from pathlib import Path

    Path(folder, f"run-{uuid.uuid4().hex}").touch()
    return "done"


@task()
def exits(code: int) -> None:
    record("exits", code)
    raise SystemExit(code)


@task()
def interrupted() -> None:
    record("interrupted", None)
    raise KeyboardInterrupt


@task()
def slow(seconds: float) -> str:
    """Sleeps ``seconds`` (longer than a short start_to_close_timeout)."""
    import time

    record("slow", seconds)
    time.sleep(seconds)
    return "late"
