"""The one rule for instance ids and the one for workflow names, on every path.

Both are 1 to 255 characters without control characters (NUL among them, which
PostgreSQL refuses in text) or lone surrogates (which no database can encode);
a workflow name is also not blank. Starts (top-level and child) and lookups use
these functions, so what works on SQLite works on PostgreSQL.
"""

from __future__ import annotations

import unicodedata

from .. import exceptions as exc

__all__ = [
    "check_instance_id",
    "check_stream_key",
    "check_workflow_name",
    "instance_id_problem",
    "name_problem",
    "valid_channel",
]

_REFUSED_CATEGORIES = ("Cc", "Cs")  # control characters, lone surrogates


def _text_problem(value: object, what: str) -> str | None:
    if not isinstance(value, str):
        return f"{what} must be a string, not {type(value).__name__}"
    if not 1 <= len(value) <= 255:
        return f"{what} must be 1 to 255 characters, not {len(value)}"
    # A printable string holds no control character and no surrogate (both are "Other"
    # in Unicode's terms): decided at C speed; only the others are looked at closely.
    if value.isprintable():
        return None
    if any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in value):
        return f"{what} must not contain control characters or lone surrogates"
    return None


def instance_id_problem(value: object, what: str = "instance id") -> str | None:
    """Why ``value`` cannot be an instance id, or None when it can."""
    return _text_problem(value, what)


def name_problem(value: object, what: str = "workflow name") -> str | None:
    """Why ``value`` cannot be a workflow (or activity) name, or None when it can."""
    problem = _text_problem(value, what)
    if problem is None and not str(value).strip():
        return f"{what} must not be blank"
    return problem


def check_stream_key(value: object) -> str:
    """Return ``value`` if it can be a stream key (the instance id's rule); else ValueError."""
    problem = _text_problem(value, "stream key")
    if problem is not None:
        raise ValueError(problem)
    return str(value)


def check_instance_id(value: object, what: str = "instance id") -> str:
    """Return ``value`` if it can be an instance id; else raise WorkflowStartRejected."""
    problem = instance_id_problem(value, what)
    if problem is not None:
        raise exc.WorkflowStartRejected(problem)
    return str(value)


def check_workflow_name(value: object) -> str:
    """Return ``value`` if it can be a workflow name; else raise WorkflowStartRejected."""
    problem = name_problem(value)
    if problem is not None:
        raise exc.WorkflowStartRejected(problem)
    return str(value)


def valid_channel(channel: object) -> bool:
    """True for a valid signal channel: 1 to 255 bytes of UTF-8 (no lone surrogates) without NUL.

    PostgreSQL refuses NUL in text, so no channel holds one on any database.
    """
    if not isinstance(channel, str) or "\x00" in channel:
        return False
    try:
        return 1 <= len(channel.encode("utf-8")) <= 255
    except UnicodeEncodeError:
        return False
