"""Autodiscovery: import ``workflows`` of every installed app and ``SELVEDGE["MODULES"]``."""

from __future__ import annotations

import importlib

from django.conf import settings
from django.utils.module_loading import autodiscover_modules


def autodiscover() -> None:
    """Import every installed app's ``workflows`` module, then the configured modules."""
    autodiscover_modules("workflows")
    for module in (getattr(settings, "SELVEDGE", None) or {}).get("MODULES", ()) or ():
        importlib.import_module(module)
