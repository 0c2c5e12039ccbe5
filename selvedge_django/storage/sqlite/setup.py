"""SQLite's connection set-up and system checks for the engine's database.

Named by :class:`~.db.SQLiteDatabase` as its ``connection_created``,
``worker_start_problem`` and ``database_checks``: WAL, the busy timeout and
``PRAGMA synchronous`` on the engine's connections, and the set-ups that cannot
work well (no IMMEDIATE transactions, a database in memory).
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Warning

from .. import sql

__all__ = ["connection_created", "database_checks", "in_memory", "worker_start_problem"]

# Connection set-up of the engine's database.
BUSY_TIMEOUT_S = 30
BUSY_TIMEOUT = f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}"
JOURNAL_WAL = "PRAGMA journal_mode = WAL"
SYNCHRONOUS = "PRAGMA synchronous = {level}"


def in_memory(name: str) -> bool:
    """Whether a SQLite database name is a database in memory (not a file)."""
    return not name or ":memory:" in name or "mode=memory" in name


def connection_created(connection: Any) -> None:
    """Give the engine's connections WAL, a generous busy timeout and durable commits.

    Only connections of the alias the engine uses (``SELVEDGE["DATABASE"]``) are
    touched: other SQLite databases of the project keep their own settings. The
    busy timeout only when the project set none (``OPTIONS["timeout"]``); WAL and
    ``PRAGMA synchronous`` (``SELVEDGE["SQLITE_SYNCHRONOUS"]``, FULL by default)
    only on a file. Every SQLite connection gets the JSON function
    ``find_instances`` needs.
    """
    from django.core.exceptions import ImproperlyConfigured

    from ...conf import get_settings
    from .input_filters import register_sqlite_function

    register_sqlite_function(connection)  # harmless anywhere; find_instances needs it
    try:
        settings = get_settings()
    except ImproperlyConfigured:
        return  # the system checks report it; never break a connection over it
    if connection.alias != settings.database:
        return
    name = str(connection.settings_dict.get("NAME") or "")
    options = connection.settings_dict.get("OPTIONS") or {}
    with connection.cursor() as cursor:
        if "timeout" not in options:
            cursor.execute(BUSY_TIMEOUT)
        if not in_memory(name):
            cursor.execute(JOURNAL_WAL)
            # A value from a fixed list (validated in conf), never user text.
            cursor.execute(sql.compose(SYNCHRONOUS, level=settings.sqlite_synchronous))


def worker_start_problem(alias: str, connection: Any) -> str | None:
    """Why a started worker cannot run on this database, or None.

    Django's SQLite test database is in memory unless ``TEST["NAME"]`` names a
    file; its connections (one per thread) share it through SQLite's shared
    cache, where a write meets another connection's table lock at once with
    "database table is locked" (the busy timeout does not apply). A plain
    ``:memory:`` database is a different, empty one in each connection.
    """
    name = str(connection.settings_dict.get("NAME") or "")
    if not in_memory(name):
        return None
    return (
        f"The selvedge database {alias!r} is an in-memory SQLite database ({name}): a "
        "started worker's threads would fail on it with 'database table is locked'. "
        f"In tests, set DATABASES[{alias!r}]['TEST']['NAME'] to a file name (for "
        "example 'test_db.sqlite3'; Django's test database is otherwise in memory), or "
        "run the workflows in the test's thread with selvedge_django.testing."
        f"run_until_idle(); elsewhere, set DATABASES[{alias!r}]['NAME'] to a file."
    )


def database_checks(alias: str, connection: Any) -> list[CheckMessage]:
    """selvedge.W002 (no IMMEDIATE transactions) and selvedge.W001 (in memory)."""
    messages: list[CheckMessage] = []
    mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
    if str(mode or "").upper() not in ("IMMEDIATE", "EXCLUSIVE"):
        messages.append(
            Warning(
                f"The selvedge database {alias!r} is SQLite without "
                "transaction_mode IMMEDIATE: concurrent write transactions can fail with "
                "'database is locked' instead of waiting for each other.",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] "
                "= 'IMMEDIATE' (or 'EXCLUSIVE').",
                id="selvedge.W002",
            )
        )
    if in_memory(str(connection.settings_dict.get("NAME") or "")):
        messages.append(
            Warning(
                "The selvedge database is an in-memory SQLite database: it cannot use "
                "WAL and is not shared with worker threads of other connections.",
                hint="Use a SQLite file (or PostgreSQL) for workers.",
                id="selvedge.W001",
            )
        )
    return messages
