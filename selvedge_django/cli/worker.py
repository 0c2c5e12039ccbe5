"""``runselvedge worker``: run the worker loops until SIGINT/SIGTERM.

The first signal finishes in-flight work and releases what is held, a second exits
at once. With ``--reload`` (the default under ``DEBUG``) Django's autoreloader
restarts the process when Python files change, as ``runserver`` does.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from .arguments import Subparsers, csv_list

__all__ = ["StopSignals", "add_parser", "handle"]


def add_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    """Add ``worker`` to ``runselvedge``'s subparsers."""
    worker: argparse.ArgumentParser = subparsers.add_parser(
        name, help="run the worker loops until SIGINT/SIGTERM"
    )
    worker.add_argument(
        "--worker-id",
        default=None,
        help="this worker's id in leases and the status report (default host-pid-random)",
    )
    worker.add_argument(
        "--queues",
        default=None,
        help="comma-separated activity queues to serve ('' serves none; default all)",
    )
    worker.add_argument(
        "--max-activities",
        type=int,
        default=None,
        help="activity attempts run at once (default MAX_CONCURRENT_ACTIVITIES)",
    )
    worker.add_argument(
        "--max-resumptions",
        type=int,
        default=None,
        help="workflow executions run at once (default MAX_CONCURRENT_RESUMPTIONS)",
    )
    worker.add_argument(
        "--reload",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="restart when Python files change, like runserver (default: DEBUG)",
    )
    return worker


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run a worker until a stop signal, reloading on code changes if asked to."""
    from django.conf import settings

    reload = options["reload"]
    if reload is None:
        reload = bool(settings.DEBUG)
    if reload:
        _run_reloading_worker(command.stdout, _worker_overrides(options))
        return
    _start_worker(command.stdout, _worker_overrides(options), StopSignals)


def _worker_overrides(options: dict[str, Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if options["worker_id"]:
        overrides["worker_id"] = options["worker_id"]
    if options["queues"] is not None:
        overrides["activity_queues"] = csv_list(options["queues"])
    for flag, key in (
        ("max_activities", "max_concurrent_activities"),
        ("max_resumptions", "max_concurrent_resumptions"),
    ):
        if options[flag] is not None:
            if options[flag] < 1:
                raise CommandError(f"--{flag.replace('_', '-')} must be at least 1")
            overrides[key] = options[flag]
    return overrides


def _start_worker(out: OutputWrapper, overrides: dict[str, Any], signals_class: Any) -> Any:
    """Run a worker until a stop signal (or, reloading, until asked to stop)."""
    from ..contrib.prometheus import start_deferred
    from ..worker import Worker

    start_deferred()  # the metrics endpoint serve_metrics() left for the serving process
    worker = Worker(**overrides)
    with signals_class() as signals:
        worker.start()
        out.write(f"selvedge worker {worker.worker_id} started")
        _print_served(out, worker)
        out.flush()
        signals.wait()
        _stop_worker(out, worker)
    return worker


def _stop_worker(out: OutputWrapper, worker: Any) -> None:
    from ..storage.postgresql.listener import stop_listeners

    out.write(f"selvedge worker {worker.worker_id} stopping")
    out.flush()
    worker.stop()
    stop_listeners()
    out.write(f"selvedge worker {worker.worker_id} stopped")
    out.flush()


def _print_served(out: OutputWrapper, worker: Any) -> None:
    from django.db import connections

    from ..registry import registered_activity_names, registered_workflow_names

    settings = worker.settings
    conn = connections[settings.database]
    out.write(f"  database: {settings.database} ({conn.vendor}, {conn.settings_dict['NAME']})")
    out.write(f"  workflows: {', '.join(registered_workflow_names()) or '(none)'}")
    out.write(f"  activities: {', '.join(registered_activity_names()) or '(none)'}")
    queues = settings.activity_queues
    shown = "all" if queues is None else ", ".join(q or "(default)" for q in queues)
    out.write(f"  queues: {shown or 'none'}")


def _run_reloading_worker(out: OutputWrapper, overrides: dict[str, Any]) -> None:
    """``--reload``: Django's autoreloader restarts the process when code changes.

    The worker runs in Django's main thread of the reloading child process; the
    reloader (or a stop signal) ends the child through this thread's exception,
    and the worker stops gracefully on the way out, releasing what it holds.
    """
    from django.utils import autoreload

    running = _ReloadStop()

    def run() -> None:
        _start_worker(out, overrides, lambda: running)

    try:
        autoreload.run_with_reloader(run)
    finally:
        running.stop_and_wait()


class _ReloadStop:
    """The stop "signal" of a worker under the autoreloader: set from the main thread."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._started = False

    def __enter__(self) -> _ReloadStop:
        self._started = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stopped.set()

    def wait(self) -> int:
        self._stop.wait()
        return signal.SIGTERM

    def stop_and_wait(self, timeout: float = 60) -> None:
        """Ask the worker thread to stop gracefully and wait until it has."""
        self._stop.set()
        if self._started:
            self._stopped.wait(timeout)


class StopSignals:
    """SIGINT and SIGTERM for ``runselvedge worker``: the first asks for a graceful
    stop, a second exits at once (status 1).

    The Python handler only records the signal. It must not take a lock: setting a
    ``threading.Event`` there deadlocks when the signal lands while the main thread
    holds that Event's lock on its way into ``wait()``, which happens under GIL
    contention right after the worker's threads start. The main thread instead
    waits on a socket that the interpreter writes to when a signal arrives
    (``signal.set_wakeup_fd``).
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._reader, self._writer = socket.socketpair()
        self._saved: list[tuple[int, Any]] = []
        self._saved_fd = -1

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            os._exit(1)

    def __enter__(self) -> StopSignals:
        for sock in (self._reader, self._writer):
            sock.setblocking(False)
        self._saved_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._saved.append((signum, signal.signal(signum, self._on_signal)))
        return self

    def wait(self) -> int:
        """Block until a stop signal has arrived; return it."""
        while not self.received:
            select.select([self._reader], [], [], 1.0)
            try:
                while self._reader.recv(512):
                    pass
            except BlockingIOError:
                pass
        return self.received[0]

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._saved:
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._saved_fd)
        self._reader.close()
        self._writer.close()
