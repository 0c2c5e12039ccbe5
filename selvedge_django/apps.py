"""The app config: fixed label, checks, SQLite connection set-up and autodiscovery."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.utils.translation import gettext_lazy as _


def _configure_sqlite(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Give the engine's SQLite connections WAL, a generous busy timeout and durable commits.

    Only connections of the alias the engine uses (``SELVEDGE["DATABASE"]``) are
    touched: other SQLite databases of the project keep their own settings.
    ``PRAGMA synchronous`` is ``SELVEDGE["SQLITE_SYNCHRONOUS"]`` (FULL by default).
    """
    if connection.vendor != "sqlite":
        return
    from django.core.exceptions import ImproperlyConfigured

    from .conf import get_settings
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
            cursor.execute("PRAGMA busy_timeout = 30000")
        if name and ":memory:" not in name and "mode=memory" not in name:
            cursor.execute("PRAGMA journal_mode = WAL")
            # A value from a fixed list (validated in conf), never user text.
            cursor.execute(f"PRAGMA synchronous = {settings.sqlite_synchronous}")


class SelvedgeConfig(AppConfig):
    """Durable execution for Django."""

    name = "selvedge_django"
    label = "selvedge_django"
    verbose_name = _("Durable workflows")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .discovery import autodiscover

        connection_created.connect(_configure_sqlite, dispatch_uid="selvedge_sqlite_setup")
        autodiscover()
