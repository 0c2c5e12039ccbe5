"""Instrumentation of the worker processes that ``bench/scale_out.py`` starts.

An app (``ProbeConfig``, in ``bench/scaleout_settings.py``'s ``INSTALLED_APPS``) that
wraps, in its worker process only, the two statements worker processes contend on:

* ``lease_batch`` (dispatch: ``FOR UPDATE SKIP LOCKED`` over the ready instances) and
* ``claim_tasks`` (activity claims: the same over the queued tasks),

recording for every call when it began, how long it took (the client's view: the round
trip and the statement), how many rows it asked for and how many it got. With more
ready rows than every worker asks for, a call that gets fewer than it asked lost them
to ``SKIP LOCKED``: rows another worker held, or took between the snapshot and the lock.

At exit the records, and the process's CPU time, are written as JSON to
``$SELVEDGE_BENCH_PROBE_DIR/<pid>.json``. (Statements are counted on the server, with
``pg_stat_statements``: the engine's prepared statements do not pass Django's execute
wrappers.)
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.apps import AppConfig

_lock = threading.Lock()
# (method, started at (wall clock), seconds, rows asked, rows got)
CALLS: list[tuple[str, float, float, int, int]] = []


def _recorded(name: str, fn: Callable[..., Any], limit_at: int) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        asked = kwargs.get("limit", args[limit_at] if len(args) > limit_at else 0)
        started = time.time()
        t = time.perf_counter()
        rows = fn(*args, **kwargs)
        took = time.perf_counter() - t
        with _lock:
            CALLS.append((name, started, took, int(asked), len(rows)))
        return rows

    return wrapper


def dump() -> None:
    """Write this process's records to ``$SELVEDGE_BENCH_PROBE_DIR/<pid>.json``."""
    folder = os.environ.get("SELVEDGE_BENCH_PROBE_DIR")
    if not folder:
        return
    times = os.times()
    with _lock:
        data = {
            "pid": os.getpid(),
            "calls": CALLS,
            "cpu_seconds": times.user + times.system,
        }
    Path(folder, f"{os.getpid()}.json").write_text(json.dumps(data))


class ProbeConfig(AppConfig):
    name = "bench"
    label = "scaleout_probe"
    verbose_name = "scale-out benchmark probe"

    def ready(self) -> None:
        from selvedge_django.storage.postgresql.store import PostgresInstances
        from selvedge_django.storage.postgresql.tasks import PostgresTasks

        # self, owner, ttl, limit, ...   and   self, owner, limit, names
        for cls, name, limit_at in (
            (PostgresInstances, "lease_batch", 3),
            (PostgresTasks, "claim_tasks", 2),
        ):
            setattr(cls, name, _recorded(name, getattr(cls, name), limit_at))
        atexit.register(dump)
