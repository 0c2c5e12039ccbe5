"""Everything the store does differently on SQLite.

:mod:`.db` holds :class:`SQLiteDatabase` (one writer at a time: ``BEGIN IMMEDIATE``,
probes before the write lock); :mod:`.turns` the writers' turns before SQLite's lock
(within a process, the renewer first, and between processes); :mod:`.setup`
its connection set-up (WAL, its pragmas) and system checks; :mod:`.store` the parts'
SQLite paths (dispatch, renewals, deliveries without ``RETURNING``);
:mod:`.input_filters` the JSON equality ``find_instances`` needs on SQLite, registered
on the engine's connections as a SQL function.
"""

from __future__ import annotations

from .db import SQLiteDatabase
from .store import SQLiteStore
from .turns import busy_timeout

__all__ = ["SQLiteDatabase", "SQLiteStore", "busy_timeout"]
