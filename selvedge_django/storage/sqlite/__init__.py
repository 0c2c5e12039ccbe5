"""Everything the store does differently on SQLite.

:mod:`.db` holds :class:`SQLiteDatabase` (one writer at a time: ``BEGIN IMMEDIATE``,
the writer turn with the renewer first, probes before the write lock); :mod:`.setup`
its connection set-up (WAL, its pragmas) and system checks; :mod:`.store` the parts'
SQLite paths (dispatch, renewals, deliveries without ``RETURNING``);
:mod:`.input_filters` the JSON equality ``find_instances`` needs on SQLite, registered
on the engine's connections as a SQL function.
"""

from __future__ import annotations

from .db import SQLiteDatabase, busy_timeout
from .store import SQLiteStore

__all__ = ["SQLiteDatabase", "SQLiteStore", "busy_timeout"]
