"""What every operation shares: the client store, and the id and text rules of lookups."""

from __future__ import annotations

import threading
from typing import Any

from .. import exceptions as exc
from ..conf import get_settings
from ..engine.identifiers import check_instance_id, instance_id_problem
from ..storage import Store, client_codec, store_for
from ..worker import handoff

__all__ = [
    "client_store",
    "filter_text",
    "known_id",
    "reason_text",
    "validate_instance_id",
]

_client: tuple[Any, Store] | None = None
_stores_lock = threading.Lock()


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
