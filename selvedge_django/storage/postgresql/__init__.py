"""Everything the store does differently on PostgreSQL.

:mod:`.db` holds :class:`PostgresDatabase` (row and advisory locks, NOTIFY, the
snapshot isolation, connection set-up and checks); :mod:`.store` holds
:class:`PostgresStore` (``SKIP LOCKED`` and the one-statement paths) with
:mod:`.inbox` (a signal received in one statement) and :mod:`.streams` (an activity's
stream write in one statement); :mod:`.sql` the statements only
PostgreSQL runs; :mod:`.listener` the LISTEN thread that carries other processes'
wake-ups into the in-process bus.
"""

from __future__ import annotations

from .db import PostgresDatabase
from .store import PostgresStore

__all__ = ["PostgresDatabase", "PostgresStore"]
