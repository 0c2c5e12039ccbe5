"""Storage: the durable operations of the engine over the Django ORM.

Layout (see the architecture section of CONTRIBUTING.md): :mod:`.store` holds
:class:`~.store.Store`, which builds a :class:`~.db.Database` (connection,
transactions, fences, wake-ups, clock) and one part per aggregate on it, each a
module of this package (:mod:`.instances`, :mod:`.starts`, :mod:`.children`,
:mod:`.waits`, :mod:`.tasks`, :mod:`.flow_control`, :mod:`.inline`,
:mod:`.resume`, :mod:`.renewals`, :mod:`.locks`, :mod:`.reads`, ...);
:mod:`.operator_reads`, :mod:`.status_reads` and :mod:`.admin_reads` hold the reads of
the operations layer and the admin (``store.operator_reads``, ``store.status``);
:mod:`.sql` names the portable statements. :mod:`.postgresql` and :mod:`.sqlite`
hold everything that differs between the two databases (a Database subclass each,
and the parts that differ there), and :func:`store_for` picks the store once.
:mod:`.schedules` stores schedule rows through a store, :mod:`.wakeups` is the
in-process bus and the NOTIFY topics, :mod:`.errors` what storage errors mean.

Storage imports nothing of the worker, the operations layer or the registry: an
upward need is a callback (``store.db.on_closed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.checks import CheckMessage
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from ..engine.codec import Codec
from .clock import DbNowMs, clock_offset_ms, set_clock_offset_ms
from .errors import RowBusy
from .lapses import attempt_error_data
from .postgresql import PostgresStore
from .sqlite import SQLiteStore
from .store import DjangoStore, InstanceHead, Store

if TYPE_CHECKING:
    from ..conf import SelvedgeSettings


def client_codec(settings: SelvedgeSettings) -> Codec:
    """The codec of stored values: Django's JSON encoder (or the ``PAYLOAD_CONVERTER``'s),
    capped at ``MAX_PAYLOAD_BYTES``, then the ``PAYLOAD_CODEC`` (if any)."""
    from django.core.serializers.json import DjangoJSONEncoder

    converter = settings.payload_converter
    payload, reader = settings.payload_codec, settings.payload_reader
    if converter is None:
        return Codec(DjangoJSONEncoder, settings.max_payload_bytes, payload=payload, reader=reader)
    return Codec(converter.encoder, settings.max_payload_bytes, converter, payload, reader)


__all__ = [
    "DbNowMs",
    "DjangoStore",
    "InstanceHead",
    "PostgresStore",
    "RowBusy",
    "SQLiteStore",
    "Store",
    "attempt_error_data",
    "check_vendor",
    "client_codec",
    "clock_offset_ms",
    "configure_connection",
    "database_checks",
    "server_checks",
    "set_clock_offset_ms",
    "store_class",
    "store_for",
    "worker_start_problem",
]

# The store class of each supported database vendor.
STORES: dict[str, type[Store]] = {"postgresql": PostgresStore, "sqlite": SQLiteStore}


def store_class(alias: str) -> type[Store] | None:
    """The store class for the database ``alias``, or None when it is not supported."""
    return STORES.get(connections[alias].vendor)


def check_vendor(alias: str) -> type[Store]:
    """The store class for ``alias``; ImproperlyConfigured for other databases."""
    cls = store_class(alias)
    if cls is None:
        raise ImproperlyConfigured(
            "selvedge_django supports SQLite and PostgreSQL; database "
            f"{alias!r} is {connections[alias].vendor!r}"
        )
    return cls


def store_for(alias: str, codec: Codec, settings: SelvedgeSettings | None = None) -> Store:
    """A new store for ``alias`` (cheap), of its database's class.

    With ``settings``, the notification settings apply: ``LISTEN_NOTIFY`` (NOTIFY
    only where the database has it) and ``LISTEN_DATABASE``.
    """
    store = check_vendor(alias)(alias, codec)
    if settings is not None:
        db, options = store.db, store.options
        if settings.listen_notify is not None:
            db.notify_enabled = settings.listen_notify and db.can_notify
        db.listen_alias = settings.listen_database or settings.database
        options.code_version = settings.code_version
        options.compatible_versions = settings.compatible_versions
        options.queue_rate_limits = dict(settings.queue_rate_limits)
        options.max_stream_entries = settings.max_stream_entries
        options.paused_queues_max_age = settings.activity_poll_interval
    return store


def configure_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: the database's own connection set-up."""
    cls = STORES.get(connection.vendor)
    if cls is not None:
        cls.database.connection_created(connection)


def server_checks(alias: str) -> list[CheckMessage]:
    """The check messages that query the engine's database server (PostgreSQL: W006).

    A database class with such checks defines ``server_checks(alias, connection)``.
    """
    cls = store_class(alias)
    checks = None if cls is None else getattr(cls.database, "server_checks", None)
    return [] if checks is None else list(checks(alias, connections[alias]))


def database_checks(alias: str) -> list[CheckMessage]:
    """The system check messages of the engine's database itself (SQLite: W001, W002)."""
    cls = store_class(alias)
    return [] if cls is None else cls.database.database_checks(alias, connections[alias])


def worker_start_problem(alias: str) -> str | None:
    """Why a started worker's threads cannot share the engine's database, or None.

    A database class with such a condition defines ``worker_start_problem(alias,
    connection)`` (SQLite: a database in memory).
    """
    cls = store_class(alias)
    check = None if cls is None else getattr(cls.database, "worker_start_problem", None)
    return None if check is None else check(alias, connections[alias])
