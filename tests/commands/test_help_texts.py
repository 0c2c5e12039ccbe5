"""Every option and argument of every ``runselvedge`` subcommand explains itself in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from selvedge_django.management.commands.runselvedge import Command

# What Django adds to every command's top-level parser (its own help texts).
DJANGO_DEFAULTS = {
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def _missing(parser: argparse.ArgumentParser, path: str, top: bool) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if top and DJANGO_DEFAULTS.intersection(action.option_strings):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            yield f"{path}: {name}"
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            yield from (
                f"{path} {sub}: (subcommand)" for sub in action.choices if sub not in helped
            )


def test_every_option_of_every_subcommand_has_a_help_text() -> None:
    top = Command().create_parser("manage.py", "runselvedge")
    walked = list(_parsers(top, "runselvedge"))
    assert len(walked) > 20  # the walk reached the subcommands and the schedules actions
    missing = [
        line for path, parser in walked for line in _missing(parser, path, top=parser is top)
    ]
    assert missing == []
