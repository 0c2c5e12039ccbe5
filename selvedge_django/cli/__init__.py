"""``manage.py runselvedge``'s subcommands, one module per group.

Each module adds its subcommands' parsers (``add_parser(subparsers, name)``) and runs
the one chosen (``handle(command, options)``): it parses nothing more, makes its
calls to the operations layer (or starts the worker) and prints to the command's
stdout. ``SUBCOMMANDS`` lists them in the order ``runselvedge --help`` shows;
``management/commands/runselvedge.py`` builds the parsers with :func:`add_parsers`
and hands the options to :func:`execute`.

- ``worker``: the worker loops, until SIGINT/SIGTERM
- ``instances``: ``start``, ``cancel``, ``signal`` and the reads of instances
  (``list``, ``tasks``, ``query``, ``describe``, ``result``, ``export-history``)
- ``lifecycle``: ``resume``, ``fork``, ``terminate``, ``pause``, ``unpause``, on one
  instance or a selection
- ``versions``: ``replay-check`` and ``versions``, for a deploy of new workflow code
- ``debug``: a read-only replay that stops in the debugger before a chosen command
- ``prune``, ``schedules``, ``queues`` (list, pause and unpause activity queues), ``status``
- ``keys``: ``rotate-keys``, stored values re-encrypted under the first payload key
- ``arguments``: the argument types and Django's common options, shared by all
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Protocol

from django.core.management.base import BaseCommand, CommandError

from .. import exceptions as exc
from . import (
    debug,
    instances,
    keys,
    lifecycle,
    prune,
    queues,
    schedules,
    status,
    versions,
    worker,
)
from .arguments import Subparsers, add_common_options

__all__ = ["SUBCOMMANDS", "Group", "add_parsers", "configure_logging", "execute"]


class Group(Protocol):
    """A module of subcommands: adds the parser of each, and runs the one chosen."""

    def add_parser(self, subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
        """Add the subcommand ``name`` to ``subparsers``; return its parser."""

    def handle(self, command: BaseCommand, options: dict[str, Any]) -> None:
        """Run the subcommand ``options["subcommand"]``, printing to ``command.stdout``."""


# Every subcommand, in the order ``runselvedge --help`` lists them, with its module.
SUBCOMMANDS: dict[str, Group] = {
    "worker": worker,
    "start": instances,
    "list": instances,
    "tasks": instances,
    "query": instances,
    "describe": instances,
    "result": instances,
    "export-history": instances,
    "cancel": instances,
    "resume": lifecycle,
    "fork": lifecycle,
    "terminate": lifecycle,
    "pause": lifecycle,
    "unpause": lifecycle,
    "signal": instances,
    "replay-check": versions,
    "versions": versions,
    "debug": debug,
    "prune": prune,
    "rotate-keys": keys,
    "schedules": schedules,
    "queues": queues,
    "status": status,
}


def add_parsers(parser: argparse.ArgumentParser) -> None:
    """Add every subcommand to ``runselvedge``'s parser, each with Django's common options."""
    sub = parser.add_subparsers(
        dest="subcommand", required=True, help="what to do (each takes --help)"
    )
    for name, group in SUBCOMMANDS.items():
        group.add_parser(sub, name)
    for subparser in sub.choices.values():
        add_common_options(subparser)


def configure_logging(verbosity: int) -> None:
    """Map ``--verbosity`` to the ``selvedge_django`` logger's level (and a handler if none)."""
    level = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}.get(verbosity, logging.DEBUG)
    logger = logging.getLogger("selvedge_django")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)


def execute(command: BaseCommand, options: dict[str, Any]) -> None:
    """Run the subcommand chosen in ``options``; a selvedge error becomes a CommandError."""
    configure_logging(int(options.get("verbosity", 1)))
    try:
        SUBCOMMANDS[options["subcommand"]].handle(command, options)
    except exc.SelvedgeError as error:
        raise CommandError(str(error)) from error
