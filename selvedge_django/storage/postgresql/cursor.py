"""The cursor of the engine's own statements on psycopg 3: server-side binding, and
its placeholders converted once per statement, not once per run.

psycopg turns ``%(name)s`` placeholders into ``$1, $2, ...`` on every execute and
caches the result only for statements under 4 KB with at most 50 parameters (so
that an ORM's ``INSERT ... VALUES`` of varying length cannot fill its cache). The
engine's hottest statements (an inline step's reservation, the close carrying an
inline result) are longer than that: converting them again on every run was about
a fifth of a busy worker's CPU. The engine's statements are a small, fixed family
(their variable parts are the lengths of a few lists), so :class:`EngineQuery`
keeps the conversion of the last :data:`CACHED_STATEMENTS` whatever their length.

The conversion itself stays psycopg's (:meth:`PostgresQuery.convert`); only its
result is kept, in the attributes psycopg's own cache fills. Where those attributes
are not there (another psycopg), the cursor is psycopg's unchanged.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

__all__ = ["CACHED_STATEMENTS", "engine_cursor_class"]

# Conversions kept (least recently used dropped first): the engine's statements with
# their list lengths number a few hundred at most.
CACHED_STATEMENTS = 512

# What convert() sets from the query alone (the rest depends on the values).
_CONVERTED = ("query", "_want_formats", "_order", "_parts")


def engine_cursor_class(base: type[Any]) -> type[Any]:
    """``base`` (Django's server-binding psycopg cursor) converting with a cache."""
    try:
        from psycopg._queries import PostgresQuery
    except ImportError:  # pragma: no cover - psycopg 2, or a psycopg without it
        return base
    if not set(_CONVERTED) <= set(getattr(PostgresQuery, "__slots__", ())):
        return base  # pragma: no cover - a psycopg whose query object differs

    cache: OrderedDict[tuple[Any, str], tuple[Any, ...]] = OrderedDict()
    lock = threading.Lock()

    class EngineQuery(PostgresQuery):
        """psycopg's query conversion, kept per statement text and encoding."""

        __slots__ = ()

        def convert(self, query: Any, vars: Any) -> None:
            if vars is None or not isinstance(query, (str, bytes)):
                super().convert(query, vars)
                return
            key = (query, self._tx.encoding)
            with lock:
                converted = cache.get(key)
                if converted is not None:
                    cache.move_to_end(key)
            if converted is None:
                super().convert(query, vars)  # converts, then binds the values
                with lock:
                    cache[key] = tuple(getattr(self, name) for name in _CONVERTED)
                    if len(cache) > CACHED_STATEMENTS:
                        cache.popitem(last=False)
                return
            for name, value in zip(_CONVERTED, converted, strict=True):
                setattr(self, name, value)
            self.dump(vars)

    return type("EngineCursor", (base,), {"_query_cls": EngineQuery, "__module__": __name__})
