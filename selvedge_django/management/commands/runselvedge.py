"""``manage.py runselvedge``: run a worker, or act on instances as an operator.

Subcommands print one line per action (or JSON for ``describe``) and fail with
CommandError (exit status 1). ``worker`` runs until SIGINT/SIGTERM: the first
signal finishes in-flight work and releases what is held, a second exits at once.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import exceptions as exc
from .. import lifecycle_cli, schedules_cli, status_cli
from ..arguments import (
    add_common_options,
    csv_list,
    json_argument,
    parse_duration,
    positive_int,
    prune_batch_size,
)

INSTANCE_ID = "the workflow instance id"


class Command(BaseCommand):
    help = "Run a selvedge worker, or operate on workflow instances."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="subcommand", required=True, help="what to do (each takes --help)"
        )
        worker = sub.add_parser("worker", help="run the worker loops until SIGINT/SIGTERM")
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

        start = sub.add_parser("start", help="start a workflow by name")
        start.add_argument("name", help="the registered workflow name")
        start.add_argument(
            "input", nargs="?", type=json_argument("input"), default=None, help="JSON input"
        )
        start.add_argument(
            "--id", dest="instance_id", default=None, help="the instance id (default random)"
        )
        start.add_argument(
            "--execution-timeout",
            type=parse_duration,
            default=None,
            help="terminate the run if it is still running after this long, e.g. 30m or 2h",
        )
        start.add_argument(
            "--if-exists",
            choices=["fail", "return"],
            default="fail",
            help="taken --id: fail or exit 0",
        )
        start.add_argument("--priority", type=int, default=0, help="-100 to 100, larger first")
        start.add_argument(
            "--allow-unregistered",
            action="store_true",
            help="start a workflow this process does not register (another service runs it)",
        )
        start.add_argument(
            "--allow-builtin",
            action="store_true",
            help="start a built-in workflow such as selvedge.prune (never selvedge.task)",
        )

        listing = sub.add_parser("list", help="print instances, newest first, one JSON per line")
        listing.add_argument(
            "--status",
            choices=["running", "completed", "failed", "cancelled"],
            default=None,
            help="only instances in this status",
        )
        listing.add_argument("--workflow", default=None, help="part of a workflow name")
        listing.add_argument(
            "--since", type=parse_duration, default=None, help="started within, e.g. 1h or 7d"
        )
        listing.add_argument(
            "--limit", type=positive_int("--limit"), default=50, help="at most this many (50)"
        )

        tasks = sub.add_parser("tasks", help="print an instance's activity tasks as JSON")
        tasks.add_argument("instance_id", help=INSTANCE_ID)

        query = sub.add_parser("query", help="answer a query handler, as JSON")
        query.add_argument("instance_id", help=INSTANCE_ID)
        query.add_argument("name", help="the query handler's name")

        describe = sub.add_parser("describe", help="print an instance's description as JSON")
        describe.add_argument("instance_id", help=INSTANCE_ID)

        result = sub.add_parser("result", help="print an instance's result as JSON")
        result.add_argument("instance_id", help=INSTANCE_ID)

        export = sub.add_parser("export-history", help="print an instance's history as JSON")
        export.add_argument("instance_id", help=INSTANCE_ID)
        export.add_argument("--output", "-o", default=None, help="write to this file")
        export.add_argument(
            "--redact",
            action="store_true",
            help="replace every recorded value (inputs, outputs, signal payloads) by its size"
            " and a keyed hash",
        )

        cancel = sub.add_parser("cancel", help="request cancellation of an instance")
        cancel.add_argument("instance_id", help=INSTANCE_ID)
        cancel.add_argument("--reason", default="", help="recorded with the cancellation")

        lifecycle_cli.add_parsers(sub)

        sig = sub.add_parser("signal", help="send a signal with a JSON payload")
        sig.add_argument("instance_id", help=INSTANCE_ID)
        sig.add_argument("channel", help="the channel the workflow receives on")
        sig.add_argument(
            "payload", nargs="?", type=json_argument("payload"), default="null", help="JSON payload"
        )
        sig.add_argument(
            "--idempotency-key", default=None, help="a repeat with this key writes nothing"
        )

        check = sub.add_parser(
            "replay-check",
            help="replay running and recently closed instances (or history files) against "
            "the registered workflow code; exit non-zero on any divergence",
        )
        check.add_argument("files", nargs="*", help="selvedge.history/v1 files to check")
        check.add_argument(
            "--recent",
            type=parse_duration,
            default="7d",
            help="also check instances closed within this duration (default 7d; 0 for none)",
        )
        check.add_argument("--limit", type=int, default=1000, help="instances per status")

        versions = sub.add_parser(
            "versions",
            help="count running instances per workflow, per code version and per patch",
        )
        versions.add_argument("--workflow", default=None, help="only this workflow name")
        versions.add_argument("--json", action="store_true", help="one JSON object per workflow")

        prune = sub.add_parser("prune", help="delete closed instances older than a duration")
        prune.add_argument(
            "--older-than", type=parse_duration, required=True, help="e.g. 30d, 12h, 90m, 3600"
        )
        prune.add_argument(
            "--status",
            action="append",
            choices=["completed", "failed", "cancelled"],
            help="only instances in this status; repeat for several (default all three)",
        )
        prune.add_argument("--workflow", default=None, help="only this workflow (exact name)")
        prune.add_argument(
            "--batch-size",
            type=prune_batch_size,
            default=500,
            help="instances deleted per transaction (500)",
        )

        schedules_cli.add_parser(sub, add_common_options)
        status_cli.add_parser(sub, parse_duration)

        for subparser in sub.choices.values():
            add_common_options(subparser)

    def _configure_logging(self, verbosity: int) -> None:
        level = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}.get(
            verbosity, logging.DEBUG
        )
        logger = logging.getLogger("selvedge_django")
        logger.setLevel(level)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
            )
            logger.addHandler(handler)

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(int(options.get("verbosity", 1)))
        name = options["subcommand"]
        try:
            getattr(self, "handle_" + name.replace("-", "_"))(**options)
        except exc.SelvedgeError as error:
            raise CommandError(str(error)) from error

    def handle_worker(self, **options: Any) -> None:
        from django.conf import settings

        reload = options["reload"]
        if reload is None:
            reload = bool(settings.DEBUG)
        if reload:
            self._run_reloading_worker(self._worker_overrides(options))
            return
        self._start_worker(self._worker_overrides(options), StopSignals)

    def _worker_overrides(self, options: dict[str, Any]) -> dict[str, Any]:
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

    def _start_worker(self, overrides: dict[str, Any], signals_class: Any) -> Any:
        """Run a worker until a stop signal (or, reloading, until asked to stop)."""
        from ...contrib.prometheus import start_deferred
        from ...worker import Worker

        start_deferred()  # the metrics endpoint serve_metrics() left for the serving process
        worker = Worker(**overrides)
        with signals_class() as signals:
            worker.start()
            self.stdout.write(f"selvedge worker {worker.worker_id} started")
            self._print_served(worker)
            self.stdout.flush()
            signals.wait()
            self._stop_worker(worker)
        return worker

    def _stop_worker(self, worker: Any) -> None:
        from ...storage.postgresql.listener import stop_listeners

        self.stdout.write(f"selvedge worker {worker.worker_id} stopping")
        self.stdout.flush()
        worker.stop()
        stop_listeners()
        self.stdout.write(f"selvedge worker {worker.worker_id} stopped")
        self.stdout.flush()

    def _print_served(self, worker: Any) -> None:
        from django.db import connections

        from ...registry import registered_activity_names, registered_workflow_names

        settings = worker.settings
        conn = connections[settings.database]
        self.stdout.write(
            f"  database: {settings.database} ({conn.vendor}, {conn.settings_dict['NAME']})"
        )
        self.stdout.write(f"  workflows: {', '.join(registered_workflow_names()) or '(none)'}")
        self.stdout.write(f"  activities: {', '.join(registered_activity_names()) or '(none)'}")
        queues = settings.activity_queues
        shown = "all" if queues is None else ", ".join(q or "(default)" for q in queues)
        self.stdout.write(f"  queues: {shown or 'none'}")

    def _run_reloading_worker(self, overrides: dict[str, Any]) -> None:
        """``--reload``: Django's autoreloader restarts the process when code changes.

        The worker runs in Django's main thread of the reloading child process; the
        reloader (or a stop signal) ends the child through this thread's exception,
        and the worker stops gracefully on the way out, releasing what it holds.
        """
        from django.utils import autoreload

        running = _ReloadStop()

        def run() -> None:
            self._start_worker(overrides, lambda: running)

        try:
            autoreload.run_with_reloader(run)
        finally:
            running.stop_and_wait()

    def handle_schedules(self, **options: Any) -> None:
        schedules_cli.handle(self, **options)

    def handle_status(self, **options: Any) -> None:
        status_cli.handle(self, **options)

    def handle_start(self, **options: Any) -> None:
        from ... import operations

        name = options["name"]
        lifecycle_cli.check_start(name, options)
        start = functools.partial(
            operations.start_workflow,
            name,
            options["input"],
            instance_id=options["instance_id"],
            execution_timeout=options.get("execution_timeout"),
            priority=options.get("priority", 0),
        )
        try:
            instance_id = start()
        except exc.WorkflowAlreadyStarted:
            if options.get("if_exists", "fail") != "return":
                raise
            # The key decided; this start only tells "exists" from "another workflow's".
            instance_id = start(if_exists="return")
            self.stdout.write(f"exists {instance_id}")
            return
        self.stdout.write(f"started {instance_id}")

    def handle_list(self, **options: Any) -> None:
        from django.utils import timezone

        from ... import operations

        since = options["since"]
        for description in operations.iter_instances(
            status=options["status"],
            workflow_name=options["workflow"],
            started_after=None if since is None else timezone.now() - since,
            limit=options["limit"],
        ):
            self.stdout.write(json.dumps(description.to_json()))

    def handle_tasks(self, **options: Any) -> None:
        from ... import operations

        tasks = operations.list_activity_tasks(options["instance_id"])
        self.stdout.write(json.dumps([task.to_json() for task in tasks], indent=2))

    def handle_query(self, **options: Any) -> None:
        from django.core.serializers.json import DjangoJSONEncoder

        from ... import operations

        answer = operations.query(options["instance_id"], options["name"])
        self.stdout.write(json.dumps(answer, indent=2, cls=DjangoJSONEncoder))

    def handle_describe(self, **options: Any) -> None:
        from ... import operations

        description = operations.describe(options["instance_id"])
        self.stdout.write(json.dumps(description.to_json(), indent=2))

    def handle_result(self, **options: Any) -> None:
        from ... import operations

        result = operations.get_workflow_result(options["instance_id"])
        self.stdout.write(json.dumps(result.to_json(), indent=2))

    def handle_export_history(self, **options: Any) -> None:
        from ... import operations

        history = operations.export_history(options["instance_id"], redact=options["redact"])
        text = history.to_json(indent=2)
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as handle:
                handle.write(text)
            self.stdout.write(f"exported {options['instance_id']} to {options['output']}")
        else:
            self.stdout.write(text)

    def handle_cancel(self, **options: Any) -> None:
        from ... import operations

        operations.cancel_workflow(options["instance_id"], options["reason"])
        self.stdout.write(f"cancel requested for {options['instance_id']}")

    def handle_terminate(self, **options: Any) -> None:
        lifecycle_cli.handle(self, "terminate", options, parse_duration)

    def handle_resume(self, **options: Any) -> None:
        lifecycle_cli.handle(self, "resume", options, parse_duration)

    def handle_fork(self, **options: Any) -> None:
        lifecycle_cli.handle(self, "fork", options, parse_duration)

    def handle_signal(self, **options: Any) -> None:
        from ... import operations

        operations.signal(
            options["instance_id"],
            options["channel"],
            options["payload"],
            idempotency_key=options.get("idempotency_key"),
        )
        self.stdout.write(f"signalled {options['instance_id']} on {options['channel']!r}")

    def handle_replay_check(self, **options: Any) -> None:
        from ... import operations

        files = []
        for path in options["files"]:
            try:
                with open(path, "rb") as handle:
                    files.append((path, handle.read()))
            except OSError as error:
                raise CommandError(f"cannot read {path}: {error}") from error
        checked = diverged = 0
        for label, problem in operations.replay_check(
            files, recent=options["recent"], limit=options["limit"]
        ):
            checked += 1
            if not isinstance(problem, exc.SelvedgeError):
                patches = problem.describe_patches()
                self.stdout.write(f"ok {label}" + (f" patches: {patches}" if patches else ""))
                continue
            diverged += 1
            unreadable = isinstance(problem, exc.UnsupportedHistoryFormat)
            self.stdout.write(f"{'INVALID' if unreadable else 'DIVERGED'} {label}: {problem}")
            cause = getattr(problem, "divergence", None)
            if cause is not None and cause is not problem:
                self.stdout.write(f"    {type(cause).__name__}: {cause}")
        self.stdout.write(f"checked {checked}, diverged {diverged}")
        if diverged:
            raise CommandError(f"{diverged} of {checked} histories diverged")

    def handle_versions(self, **options: Any) -> None:
        from ... import operations

        for entry in operations.running_versions(options["workflow"]):
            if options["json"]:
                self.stdout.write(json.dumps(entry.to_json(), sort_keys=True))
                continue
            self.stdout.write(f"{entry.workflow_name}: {entry.running} running")
            for version, count in entry.versions.items():
                label = "(none)" if version is None else version
                self.stdout.write(f"  code version {label}: {count}")
            for patch_id, count in entry.patches.items():
                self.stdout.write(
                    f"  patch {patch_id}: {count} with its marker, {entry.running - count} without"
                )

    def handle_prune(self, **options: Any) -> None:
        from ... import operations

        def progress(total: int) -> None:
            self.stdout.write(f"deleted {total} so far")

        total = operations.prune(
            options["older_than"],
            statuses=options["status"],
            workflow_name=options["workflow"],
            batch_size=options["batch_size"],
            progress=progress,
        )
        self.stdout.write(f"pruned {total} instances")


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
