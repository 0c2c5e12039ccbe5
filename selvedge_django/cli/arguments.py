"""The argument types and common options of ``manage.py runselvedge``'s subcommands."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeAlias

__all__ = [
    "Subparsers",
    "add_attr_option",
    "add_common_options",
    "attribute_filters",
    "csv_list",
    "history_position",
    "json_argument",
    "parse_duration",
    "positive_int",
    "prune_batch_size",
]

# What ``add_subparsers()`` returns: each subcommand module adds its parsers to it.
Subparsers: TypeAlias = "argparse._SubParsersAction[Any]"


def json_argument(what: str) -> Callable[[str], Any]:
    """An argparse type: the argument's JSON value (``what`` names it in the error)."""

    def parse(text: str) -> Any:
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as error:
            raise argparse.ArgumentTypeError(f"{what} is not JSON: {error}") from error

    return parse


def positive_int(flag: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least 1 (``flag`` names it in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, not {value}")
        return value

    return parse


def prune_batch_size(text: str) -> int:
    """An argparse type: a prune batch size, from 1 to the most one batch deletes."""
    from ..operations import MAX_PRUNE_BATCH

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 1 <= value <= MAX_PRUNE_BATCH:
        raise argparse.ArgumentTypeError(f"--batch-size must be from 1 to {MAX_PRUNE_BATCH}")
    return value


def _attr_pair(text: str) -> tuple[str, str]:
    """An argparse type: ``name=value`` of a search attribute filter."""
    from ..engine.attributes import check_name

    name, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"--attr takes name=value, not {text!r}"[:300])
    try:
        return check_name(name), value
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_attr_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--attr name=value`` (repeatable, combined by AND) to a selecting subcommand."""
    parser.add_argument(
        "--attr",
        dest="attr",
        type=_attr_pair,
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="only instances whose search attribute NAME holds VALUE (text, or the number,"
        " true/false or ISO datetime it spells); repeat for several names (all must match)",
    )


def attribute_filters(pairs: list[tuple[str, str]] | None) -> dict[str, Any] | None:
    """``--attr`` pairs as ``find_instances(attributes=...)`` takes them (None: none).

    Each value matches an attribute holding the text or what it spells
    (:func:`~selvedge_django.engine.attributes.value_from_text`); a name given twice
    raises ValueError.
    """
    from ..engine.attributes import value_from_text

    if not pairs:
        return None
    filters: dict[str, Any] = {}
    for name, text in pairs:
        key = f"{name}__in"
        if key in filters:
            raise ValueError(f"--attr names {name!r} twice")
        filters[key] = value_from_text(text)
    return filters


def csv_list(value: str) -> list[str]:
    """A comma-separated list, without blanks ('' is none)."""
    return [part.strip() for part in value.split(",") if part.strip()] if value else []


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Accept Django's common options after a subcommand's own arguments too.

    ``manage.py`` reads ``--settings`` and ``--pythonpath`` wherever they stand, but
    a subparser rejects what it does not know (``runselvedge worker
    --settings=config.prod``). SUPPRESS leaves the top-level value (or Django's
    default) in place unless the option is given after the subcommand.
    """
    quiet = argparse.SUPPRESS
    parser.add_argument(
        "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=quiet, help="as for Django"
    )
    parser.add_argument("--settings", default=quiet, help="as for Django")
    parser.add_argument("--pythonpath", default=quiet, help="as for Django")
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        parser.add_argument(flag, action="store_true", default=quiet, help="as for Django")


def parse_duration(text: str) -> timedelta:
    """An argparse type: ``30d``, ``12h``, ``90m``, ``45s`` or plain seconds as a timedelta."""
    value = text.strip().lower()
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    factor = 1
    if value and value[-1] in units:
        factor = units[value[-1]]
        value = value[:-1]
    try:
        seconds = float(value) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use e.g. 30d, 12h, 90m or 3600"
        ) from None
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}")
    return timedelta(seconds=seconds)


def history_position(text: str) -> str | int:
    """A step of a history (``--at``, ``--stop-at``): digits are a command position
    (``seq``), anything else a history key."""
    return int(text) if text.isdigit() else text
