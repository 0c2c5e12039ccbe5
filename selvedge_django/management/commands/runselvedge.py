"""``manage.py runselvedge``: run a worker, or act on instances as an operator.

Subcommands print one line per action (or JSON for ``describe``) and fail with
CommandError (exit status 1). ``worker`` runs until SIGINT/SIGTERM: the first
signal finishes in-flight work and releases what is held, a second exits at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import exceptions as exc


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()] if value else []


class Command(BaseCommand):
    help = "Run a selvedge worker, or start, describe and cancel workflow instances."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)
        worker = sub.add_parser("worker", help="run the worker loops until SIGINT/SIGTERM")
        worker.add_argument("--worker-id", default=None)
        worker.add_argument(
            "--queues",
            default=None,
            help="comma-separated activity queues to serve ('' serves none; default all)",
        )
        worker.add_argument("--max-activities", type=int, default=None)
        worker.add_argument("--max-resumptions", type=int, default=None)

        start = sub.add_parser("start", help="start a workflow by name")
        start.add_argument("name")
        start.add_argument("input", nargs="?", default=None, help="JSON input")
        start.add_argument("--id", dest="instance_id", default=None)

        describe = sub.add_parser("describe", help="print an instance's description as JSON")
        describe.add_argument("instance_id")

        result = sub.add_parser("result", help="print an instance's result as JSON")
        result.add_argument("instance_id")

        # Django's -v/--verbosity is also accepted after the subcommand
        # (``runselvedge worker -v 2``); SUPPRESS keeps the top-level value otherwise.
        for subparser in sub.choices.values():
            subparser.add_argument(
                "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=argparse.SUPPRESS
            )

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
        from ...worker import Worker

        overrides: dict[str, Any] = {}
        if options["worker_id"]:
            overrides["worker_id"] = options["worker_id"]
        if options["queues"] is not None:
            overrides["activity_queues"] = _csv(options["queues"])
        for flag, key in (
            ("max_activities", "max_concurrent_activities"),
            ("max_resumptions", "max_concurrent_resumptions"),
        ):
            if options[flag] is not None:
                if options[flag] < 1:
                    raise CommandError(f"--{flag.replace('_', '-')} must be at least 1")
                overrides[key] = options[flag]
        worker = Worker(**overrides)
        stop = threading.Event()
        received: list[int] = []

        def on_signal(signum: int, frame: Any) -> None:
            received.append(signum)
            if len(received) > 1:
                os._exit(1)
            stop.set()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        worker.start()
        self.stdout.write(f"selvedge worker {worker.worker_id} started")
        self.stdout.flush()
        stop.wait()
        self.stdout.write(f"selvedge worker {worker.worker_id} stopping")
        self.stdout.flush()
        worker.stop()
        self.stdout.write(f"selvedge worker {worker.worker_id} stopped")

    def handle_start(self, **options: Any) -> None:
        from ... import operations

        value = None
        if options["input"] is not None:
            try:
                value = json.loads(options["input"])
            except ValueError as error:
                raise CommandError(f"input is not JSON: {error}") from error
        instance_id = operations.start_workflow(
            options["name"], value, instance_id=options["instance_id"]
        )
        self.stdout.write(f"started {instance_id}")

    def handle_describe(self, **options: Any) -> None:
        from ... import operations

        description = operations.describe(options["instance_id"])
        self.stdout.write(json.dumps(description.to_json(), indent=2))

    def handle_result(self, **options: Any) -> None:
        from ... import operations
        from ...engine.codec import error_to_envelope

        result = operations.get_workflow_result(options["instance_id"])
        self.stdout.write(
            json.dumps(
                {
                    "instance_id": result.instance_id,
                    "status": result.status,
                    "output": result.output,
                    "error": error_to_envelope(result.error, with_traceback=False)
                    if result.error is not None
                    else None,
                },
                indent=2,
            )
        )
