"""The old path of :class:`~selvedge_django.models.system.PriorityRank`.

Migrations 0017 and 0018 name the index expression ``selvedge_django.flow_models.PriorityRank``;
it lives in :mod:`selvedge_django.models.system` and stays importable here so that they load
unchanged (a migration written from now on names the new path).
"""

from __future__ import annotations

from .models.system import PriorityRank

__all__ = ["PriorityRank"]
