"""PostgreSQL's connection set-up and system checks for the engine's database.

Named by :class:`~.db.PostgresDatabase` as its ``connection_created`` and
``server_checks``: the guard that names the pooler when a prepared statement is
missing from a session, and the warning when the server runs without autovacuum.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Warning

from ..errors import guard_prepared_statements
from .sql import SHOW_AUTOVACUUM

__all__ = ["connection_created", "server_checks"]


def connection_created(connection: Any) -> None:
    """Name the pooler when a prepared statement is missing from a session.

    A connection of an engine alias (``DATABASE``, ``RENEWAL_DATABASE``, ``READ_DATABASE``)
    whose statements may be prepared (the engine's own, with ``PREPARED_STATEMENTS``;
    all of them with ``OPTIONS["server_side_binding"]``) runs its statements through
    :func:`~selvedge_django.storage.errors.guard_prepared_statements`; a connection
    that prepares nothing is left alone.
    """
    from django.core.exceptions import ImproperlyConfigured

    from ...conf import get_settings

    options = connection.settings_dict.get("OPTIONS") or {}
    try:
        settings = get_settings()
    except ImproperlyConfigured:
        return  # the system checks report it; never break a connection over it
    if not (options.get("server_side_binding") or settings.prepared_statements):
        return
    if connection.alias not in settings.engine_aliases:
        return
    if guard_prepared_statements not in connection.execute_wrappers:
        # First, so outermost, and out of the way of a wrapper installed for a
        # moment (``execute_wrapper()`` pops the last one when it ends).
        connection.execute_wrappers.insert(0, guard_prepared_statements)


def server_checks(alias: str, connection: Any) -> list[CheckMessage]:
    """selvedge.W006: the server runs without autovacuum.

    Every lease, release and claim rewrites an instance or task row, so the
    partial indexes dispatch and claims walk fill with dead entries that only
    vacuum removes, and the planner works without statistics: each poll slows
    as the tables grow.
    """
    with connection.cursor() as cursor:
        cursor.execute(SHOW_AUTOVACUUM)
        (value,) = cursor.fetchone()
    if str(value).lower() == "on":
        return []
    return [
        Warning(
            f"autovacuum is {value} on the PostgreSQL server of database {alias!r}: the "
            "engine's tables and indexes fill with dead rows and lose their statistics, "
            "and dispatch and claims slow down as they grow.",
            hint="Turn autovacuum on (see docs/deployment.md), or VACUUM ANALYZE the "
            "selvedge_django tables on a schedule.",
            id="selvedge.W006",
        )
    ]
