"""The app config: fixed label, checks, the database's connection set-up, the task
signals, the workflow handles' client and autodiscovery."""

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings
from django.db.backends.signals import connection_created
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


def autodiscover() -> None:
    """Import every installed app's ``workflows`` module, then the configured modules."""
    autodiscover_modules("workflows")
    for module in (getattr(settings, "SELVEDGE", None) or {}).get("MODULES", ()) or ():
        importlib.import_module(module)


class SelvedgeConfig(AppConfig):
    """Durable execution for Django."""

    name = "selvedge_django"
    label = "selvedge_django"
    verbose_name = _("Durable workflows")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .operations.handles import install_client
        from .storage import configure_connection
        from .tasks.finished import connect as connect_task_signals

        connection_created.connect(configure_connection, dispatch_uid="selvedge_sqlite_setup")
        connect_task_signals()  # django.tasks' task_finished after a task's close commits
        install_client()  # workflow handles call the operations layer, above them
        autodiscover()
