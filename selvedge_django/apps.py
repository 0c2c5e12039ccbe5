"""The app config: fixed label, checks, SQLite connection set-up and autodiscovery."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def _configure_sqlite(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Put SQLite connections in WAL mode with a generous busy timeout."""
    if connection.vendor != "sqlite":
        return
    name = str(connection.settings_dict.get("NAME") or "")
    options = connection.settings_dict.get("OPTIONS") or {}
    with connection.cursor() as cursor:
        if "timeout" not in options:
            cursor.execute("PRAGMA busy_timeout = 30000")
        if name and ":memory:" not in name and "mode=memory" not in name:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")


class SelvedgeConfig(AppConfig):
    """Durable execution for Django."""

    name = "selvedge_django"
    label = "selvedge_django"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .discovery import autodiscover

        connection_created.connect(_configure_sqlite, dispatch_uid="selvedge_sqlite_setup")
        autodiscover()
