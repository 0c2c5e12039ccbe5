"""The admin of system locks: the named leases (the leader's among them), read-only."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ..models import SystemLock
from .base import ReadOnlyAdmin
from .display import format_time, ms_datetime

__all__ = ["SystemLockAdmin"]


@admin.display(description=_("expires"), ordering="expires_ms")
def expires(obj: SystemLock) -> str | None:
    return format_time(ms_datetime(obj.expires_ms or None)) or None


@admin.register(SystemLock)
class SystemLockAdmin(ReadOnlyAdmin):
    """Named leases (the leader's among them): who holds them and until when."""

    # Names and display functions: Django takes both, django-stubs types names only.
    list_display: Any = ("name", "owner", "epoch", expires)
    fields: ClassVar[Any] = ("name", "owner", "epoch", expires)
    readonly_fields: ClassVar[Any] = fields
