"""The store's parts on one :class:`~.db.Database`, while they are still one class.

:class:`StoreBase` holds the database (``self.db``) and the settings the parts
read, and hands every plumbing call to the database: one place per dialect hook
(:mod:`.postgresql.db`, :mod:`.sqlite.db`), none along the parts' MRO. It goes
when the parts are members of :class:`~.store.Store`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from django.db.models.expressions import Combinable

from ..engine.codec import Codec
from ..engine.events import Fence, HistoryRow
from .db import Database
from .operation import operation
from .options import StoreOptions
from .sql import Sql
from .wakeups import Bus

__all__ = ["StoreBase"]


class StoreBase:
    """The settings of the store's parts and their database's plumbing, delegated."""

    #: The database class of this store (one per dialect).
    database: ClassVar[type[Database]] = Database
    #: Whether a write transaction locks the whole database (SQLite), not rows.
    single_writer: ClassVar[bool] = False

    def __init__(self, alias: str, codec: Codec) -> None:
        self.db = self.database(alias, codec)
        self.options = StoreOptions()

    # -- the options, held by the parts too ------------------------------------------------

    @property
    def lease_ttl(self) -> float:
        return self.options.lease_ttl

    @lease_ttl.setter
    def lease_ttl(self, value: float) -> None:
        self.options.lease_ttl = value

    @property
    def activity_names(self) -> Callable[[], Sequence[str] | None]:
        return self.options.activity_names

    @activity_names.setter
    def activity_names(self, value: Callable[[], Sequence[str] | None]) -> None:
        self.options.activity_names = value

    @property
    def activity_queues(self) -> tuple[str, ...] | None:
        return self.options.activity_queues

    @activity_queues.setter
    def activity_queues(self, value: tuple[str, ...] | None) -> None:
        self.options.activity_queues = value

    @property
    def code_version(self) -> str | None:
        return self.options.code_version

    @code_version.setter
    def code_version(self, value: str | None) -> None:
        self.options.code_version = value

    @property
    def compatible_versions(self) -> tuple[str | None, ...] | None:
        return self.options.compatible_versions

    @compatible_versions.setter
    def compatible_versions(self, value: tuple[str | None, ...] | None) -> None:
        self.options.compatible_versions = value

    @property
    def queue_rate_limits(self) -> dict[str, tuple[int, int]]:
        return self.options.queue_rate_limits

    @queue_rate_limits.setter
    def queue_rate_limits(self, value: dict[str, tuple[int, int]]) -> None:
        self.options.queue_rate_limits = value

    @property
    def queues_full_until(self) -> dict[str, float]:
        return self.options.queues_full_until

    @queues_full_until.setter
    def queues_full_until(self, value: dict[str, float]) -> None:
        self.options.queues_full_until = value

    # -- the database's own attributes --------------------------------------------------------

    @property
    def alias(self) -> str:
        return self.db.alias

    @property
    def codec(self) -> Codec:
        return self.db.codec

    @property
    def vendor(self) -> str:
        return self.db.vendor

    @property
    def identity(self) -> str:
        return self.db.identity

    @property
    def bus(self) -> Bus:
        return self.db.bus

    @property
    def connection(self) -> Any:
        return self.db.connection

    @property
    def notify_enabled(self) -> bool:
        return self.db.notify_enabled

    @notify_enabled.setter
    def notify_enabled(self, value: bool) -> None:
        self.db.notify_enabled = value

    @property
    def urgent_writes(self) -> bool:
        return self.db.urgent_writes

    @urgent_writes.setter
    def urgent_writes(self, value: bool) -> None:
        self.db.urgent_writes = value

    @property
    def listen_alias(self) -> str:
        return self.db.listen_alias

    @listen_alias.setter
    def listen_alias(self, value: str) -> None:
        self.db.listen_alias = value

    @property
    def on_closed(self) -> Callable[[str], None] | None:
        return self.db.on_closed

    @on_closed.setter
    def on_closed(self, value: Callable[[str], None] | None) -> None:
        self.db.on_closed = value

    @property
    def _inline(self) -> Any:
        return self.db._inline

    # -- plumbing, delegated -------------------------------------------------------------------

    _fenced_error = staticmethod(Database._fenced_error)
    _key_conflict = staticmethod(Database._key_conflict)

    def _chunks(self, values: list[Any], *, values_each: int = 1) -> list[list[Any]]:
        return self.db._chunks(values, values_each=values_each)

    # SKIP connection_created ['classmethod']
    # SKIP database_checks ['classmethod']
    # SKIP connection ['property']
    @operation
    def now_expr(self, plus_seconds: float = 0.0) -> Combinable:
        return self.db.now_expr(plus_seconds)

    @operation
    def now_ms(self) -> int:
        return self.db.now_ms()

    @operation
    def now_sql(self, plus_seconds: float = 0.0) -> Sql:
        return self.db.now_sql(plus_seconds)

    @operation
    def atomic(self) -> contextlib.AbstractContextManager[None]:
        return self.db.atomic()

    @operation
    def read_snapshot(self) -> contextlib.AbstractContextManager[None]:
        return self.db.read_snapshot()

    @operation
    def worth_locking(self, queryset: Any) -> bool:
        return self.db.worth_locking(queryset)

    def _worth_writing(self, probe: str, params: Sequence[Any]) -> bool:
        return self.db._worth_writing(probe, params)

    @operation
    def allow_idle_transaction(self, seconds: float | None) -> None:
        return self.db.allow_idle_transaction(seconds)

    @operation
    def after_commit(self, *topics: str) -> None:
        return self.db.after_commit(*topics)

    def _publish_now(self, *topics: str) -> None:
        return self.db._publish_now(*topics)

    def _closed(self, instance_id: str) -> None:
        return self.db._closed(instance_id)

    def _closed_on_commit(self, instance_id: str) -> None:
        return self.db._closed_on_commit(instance_id)

    def _execute(self, statement: str, params: Sequence[Any]) -> int:
        return self.db._execute(statement, params)

    def _fetch(self, statement: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self.db._fetch(statement, params)

    def _tables(self, statement: str) -> str:
        return self.db._tables(statement)

    def _insert(
        self,
        model: Any,
        values: dict[str, Any],
        *,
        returning_id: bool = False,
        where: Sql | None = None,
        on_conflict: str = "",
    ) -> Any:
        return self.db._insert(
            model, values, returning_id=returning_id, where=where, on_conflict=on_conflict
        )

    def _insert_new(self, template: str, rows: list[tuple[str, list[Any]]]) -> list[str]:
        return self.db._insert_new(template, rows)

    def _insert_parts(
        self, model: Any, values: dict[str, Any], *, skip_pk: bool
    ) -> tuple[str, str, list[Any]]:
        return self.db._insert_parts(model, values, skip_pk=skip_pk)

    # SKIP _chunks ['classmethod']
    def _fence_sql(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
    ) -> tuple[str, list[Any]]:
        return self.db._fence_sql(fence, current_step, release=release, uncancelled=uncancelled)

    def _fence(
        self,
        fence: Fence,
        current_step: str | None = None,
        *,
        release: bool = False,
        uncancelled: bool = False,
    ) -> None:
        return self.db._fence(fence, current_step, release=release, uncancelled=uncancelled)

    def _cancel_reason_under(self, fence: Fence) -> str | None:
        return self.db._cancel_reason_under(fence)

    # SKIP _fenced_error ['staticmethod']
    # SKIP _key_conflict ['staticmethod']
    def _now_param(self, now: Any = None) -> Any:
        return self.db._now_param(now)

    def _history_insert_sql(
        self, instance_id: str, row: HistoryRow, source: str | None = None
    ) -> tuple[str, list[Any]]:
        return self.db._history_insert_sql(instance_id, row, source)

    def _insert_row(self, instance_id: str, row: HistoryRow) -> HistoryRow:
        return self.db._insert_row(instance_id, row)

    @operation
    def get_row(self, instance_id: str, key: str) -> HistoryRow | None:
        return self.db.get_row(instance_id, key)

    @operation
    def wake_sql(self) -> Sql:
        return self.db.wake_sql()

    @operation
    def wake_fields(self) -> dict[str, Any]:
        return self.db.wake_fields()

    def _wake_sql(self, instance_id: str, condition: str = "") -> tuple[str, list[Any]]:
        return self.db._wake_sql(instance_id, condition)

    def _wake(self, instance_id: str, condition: str = "", params: Sequence[Any] = ()) -> int:
        return self.db._wake(instance_id, condition, params)

    def _lock_instance(self, instance_id: str, *, skip_locked: bool = False) -> bool:
        return self.db._lock_instance(instance_id, skip_locked=skip_locked)

    def _lock_task(self, task_id: int) -> bool:
        return self.db._lock_task(task_id)

    def _lock_limits(self, queues: Sequence[str], keys: Sequence[str]) -> None:
        return self.db._lock_limits(queues, keys)
