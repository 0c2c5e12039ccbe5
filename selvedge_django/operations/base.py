"""What every operation shares: the client and read stores, and the rules of lookups.

The client store writes, and reads what must be current, on the engine's database
(``SELVEDGE["DATABASE"]``, the primary). :func:`read_store` is the one seam of the
operator's reads (the admin's pages, the dashboard, the status report,
``find_instances``, exports, queries): a store on ``SELVEDGE["READ_DATABASE"]``, a
replica that may lag behind. It gives the client store instead, so a read sees the
writes just made, inside :func:`primary_reads` (the admin's page right after an
action), inside a transaction on the engine's database (its writes are not
committed, so no replica has them), and when no read database is set apart.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from django.db import connections

from .. import exceptions as exc
from ..conf import get_settings
from ..engine.identifiers import check_instance_id, instance_id_problem
from ..storage import Store, client_codec, store_for
from ..worker import handoff

__all__ = [
    "client_store",
    "filter_text",
    "known_id",
    "primary_reads",
    "read_alias",
    "read_store",
    "reason_text",
    "validate_instance_id",
]

_client: tuple[Any, Store] | None = None
_reader: tuple[Any, Store] | None = None
_stores_lock = threading.Lock()
# Set by primary_reads(): this thread's (or task's) reads must see the writes just made.
_primary: ContextVar[bool] = ContextVar("selvedge_primary_reads", default=False)


def client_store() -> Store:
    """The client API's store, rebuilt whenever the settings object changes."""
    global _client
    settings = get_settings()
    with _stores_lock:
        if _client is None or _client[0] is not settings:
            store = store_for(settings.database, client_codec(settings), settings)
            store.db.on_closed = handoff.finished
            _client = (settings, store)
        return _client[1]


@contextlib.contextmanager
def primary_reads() -> Iterator[None]:
    """Make the operator's reads in the block read the engine's database, not a replica.

    For a read that must see a write just made (the page an operator lands on after
    an action): a replica may not have it yet.
    """
    token = _primary.set(True)
    try:
        yield
    finally:
        _primary.reset(token)


def read_alias() -> str:
    """The alias the operator's reads use now: ``READ_DATABASE``, or the engine's database
    when the read must be current (see the module docstring)."""
    settings = get_settings()
    primary = settings.database
    alias = settings.read_database
    if alias is None or alias == primary or _primary.get():
        return primary
    if connections[primary].in_atomic_block:
        return primary
    return alias


def read_store() -> Store:
    """The store of the operator's reads: on :func:`read_alias`, rebuilt whenever the
    settings object changes. Never write through it: a replica refuses writes."""
    global _reader
    alias = read_alias()
    settings = get_settings()
    if alias == settings.database:
        return client_store()
    with _stores_lock:
        if _reader is None or _reader[0] is not settings:
            _reader = (settings, store_for(alias, client_codec(settings), settings))
        return _reader[1]


def validate_instance_id(instance_id: object) -> str:
    """Return a valid instance id or raise WorkflowStartRejected (see engine.identifiers)."""
    return check_instance_id(instance_id)


def known_id(instance_id: object) -> str:
    """Return ``instance_id`` for a lookup; raise WorkflowNotFound if no instance can have it.

    An id that breaks the instance-id rule was refused at every start, so the
    answer is known without a query (and PostgreSQL is never sent a NUL).
    """
    if instance_id_problem(instance_id) is not None:
        raise exc.WorkflowNotFound(repr(instance_id)[:300])
    return str(instance_id)


def reason_text(reason: object) -> str:
    """An operator's reason as the database stores it: text without NUL, at most 10,000
    characters."""
    if not isinstance(reason, str):
        raise TypeError("reason must be a string")
    return filter_text(reason, "reason")[:10_000]


def filter_text(value: object, what: str) -> str:
    """A text filter the database can take: a string of UTF-8 without NUL."""
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError(f"{what} must be a string without NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid UTF-8 (no lone surrogates)") from None
    return value
