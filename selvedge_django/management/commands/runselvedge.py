"""``manage.py runselvedge``: run a worker, or act on instances as an operator.

Subcommands print one line per action (or JSON for ``describe``) and fail with
CommandError (exit status 1). ``worker`` runs until SIGINT/SIGTERM: the first
signal finishes in-flight work and releases what is held, a second exits at once.

The subcommands live in :mod:`selvedge_django.cli`, one module per group: this
command builds their parsers and hands the options to the one chosen. Django's
common options (``--settings``, ``-v``, ...) work before and after a subcommand.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ... import cli

# Importable from here as before: the worker's stop signals and the duration type.
from ...cli.arguments import parse_duration
from ...cli.worker import StopSignals

__all__ = ["Command", "StopSignals", "parse_duration"]


class Command(BaseCommand):
    help = "Run a selvedge worker, or operate on workflow instances."

    def add_arguments(self, parser: CommandParser) -> None:
        cli.add_parsers(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        cli.execute(self, options)
