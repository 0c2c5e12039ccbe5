"""The claim's candidates and the limits they pass: priorities, concurrency keys, rates.

A claim picks its candidates with one statement (``sql.CLAIM_PICK``): lapsed claims
first, then due queued tasks by priority and age, skipping tasks whose concurrency
key is at its limit, held tasks (of paused instances), paused queues and
rate-limited queues known to be full. The candidates that have a key or a
rate-limited queue are then counted against their limits under the limits' locks,
in the claim's transaction (:meth:`Limits._within_limits`); others pass without a
statement. docs/flow-control.md states the rules.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from . import sql
from .clock import clock_offset_ms
from .db import Database
from .options import StoreOptions
from .pauses import Pauses

__all__ = ["Limits"]


class Limits:
    """The candidates of activity claims, and the limits that hold some of them back
    (``store.limits``)."""

    def __init__(self, db: Database, options: StoreOptions, *, pauses: Pauses) -> None:
        self.db = db
        self.options = options
        self.pauses = pauses

    def _claim_pick(self, names: Sequence[str], limit: int) -> tuple[str, dict[str, Any]]:
        """sql.CLAIM_PICK with this store's queues, paused and full queues, held tasks
        and concurrency room."""
        filters = sql.compose(
            sql.CLAIM_NOT_HELD, not_held=self.db.NOT_HELD_SQL.replace("{row}", "{task}")
        )
        params = sql.numbered("name", names)
        if self.options.activity_queues is not None:
            queues = list(self.options.activity_queues)
            filters += sql.compose(sql.CLAIM_QUEUES, queues=sql.marks(len(queues), "queue"))
            params.update(sql.numbered("queue", queues))
        skipped = self._skipped_queues()
        if skipped:
            filters += sql.compose(sql.CLAIM_NOT_QUEUES, queues=sql.marks(len(skipped), "skipped"))
            params.update(sql.numbered("skipped", skipped))
        filters += " AND " + sql.CONCURRENCY_ROOM
        statement = sql.compose(
            sql.CLAIM_PICK,
            names=sql.claim_names(len(names)),
            filters=filters,
            lock=self.db.CLAIM_LOCK,
            limit=str(int(limit)),
            hint=self.db._index_hint("sv_task_rank_idx"),
        )
        return statement, params

    def _next_in_queue(self, names: Sequence[str] | None) -> RawSQL:
        """sql.INLINE_NEXT for a claim by a worker serving ``names`` (None: all)."""
        served = [] if names is None else list(names)
        text = sql.compose(
            sql.INLINE_NEXT,
            names=sql.in_list("c.name", len(served))
            + " AND "
            + self.db.NOT_HELD_SQL.replace("{row}", "c"),
            hint=self.db._index_hint("sv_task_rank_idx"),
        )
        clock = [clock_offset_ms()]
        return RawSQL(self.db._tables(text, named=False), [*clock, *served, *clock], BooleanField())

    def _claim_probe(self, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """Whether a claim would find a candidate (:meth:`Database._worth_writing`'s probe)."""
        statement, params = self._claim_pick(names, 1)
        return sql.compose(sql.CLAIM_PROBE, pick=statement), params

    def _skipped_queues(self) -> list[str]:
        """The queues no claim takes from now: paused ones, and full rate-limited ones."""
        return sorted({*self.pauses.paused_queue_names(), *self._full_queues()})

    def _inline_skipped_queues(self) -> list[str]:
        """The queues an inline claim leaves alone: paused ones, and every rate-limited
        one (their claims are counted by a claim batch)."""
        return sorted({*self.pauses.paused_queue_names(), *self.options.queue_rate_limits})

    def _full_queues(self) -> list[str]:
        """The rate-limited queues whose window was full at their last claim, until it
        frees (a hint: the count under the queue's lock decides)."""
        now = _local_clock_ms()
        full = self.options.queues_full_until
        for queue in [q for q, until in full.items() if until <= now]:
            del full[queue]
        return sorted(full)

    def _within_limits(
        self, rows: list[tuple[int, str, str, int | None]]
    ) -> tuple[list[int], list[int]]:
        """The ids of the candidate ``rows`` (id, queue, key, max) that their limits let
        in, and those of them in rate-limited queues (for :meth:`_record_queue_claims`).

        Rows without a concurrency key or a rate-limited queue pass with no statement.
        Otherwise the limits' locks are taken (the dialect's; SQLite's write lock
        already serialises claims), then the live attempts of each key and each
        queue's window are counted, and the rows are taken in order while both have
        room.
        """
        limits = self.options.queue_rate_limits
        keys = sorted({key for _, _, key, _ in rows if key})
        queues = sorted({queue for _, queue, _, _ in rows if queue in limits})
        if not keys and not queues:
            return [row[0] for row in rows], []
        self.db._lock_limits(queues, keys)
        running: dict[str, int] = {}
        if keys:
            statement = sql.compose(sql.RUNNING_BY_KEY, keys=sql.marks(len(keys), "key"))
            counted = self.db._fetch(statement, sql.numbered("key", keys))
            running = {key: int(count) for key, count in counted}
        room: dict[str, int] = {}
        for queue in queues:
            room[queue] = self._queue_room(queue, *limits[queue])
        taken: list[int] = []
        limited: list[int] = []
        for task_id, queue, key, max_concurrency in rows:
            if key and running.get(key, 0) >= (max_concurrency or 0):
                continue
            if queue in room:
                if room[queue] <= 0:
                    continue
                room[queue] -= 1
                limited.append(task_id)
            if key:
                running[key] = running.get(key, 0) + 1
            taken.append(task_id)
        return taken, limited

    def _record_queue_claims(self, task_ids: list[int]) -> None:
        """Record the claims just taken of rate-limited queues, in the claim's transaction,
        at the claims' own time (``claim_started_ms``, later than the count before them)."""
        if task_ids:
            statement = sql.compose(sql.QUEUE_RECORD, ids=sql.marks(len(task_ids), "task"))
            self.db._execute(statement, sql.numbered("task", task_ids))

    def _queue_room(self, queue: str, count: int, period_ms: int) -> int:
        """How many claims ``queue``'s window has room for now (pruning what left it);
        a full window is remembered in :attr:`queues_full_until` until it frees."""
        window_params = {"queue": queue, "period_ms": period_ms}
        self.db._execute(sql.QUEUE_PRUNE, window_params)
        window = self.db._fetch(sql.QUEUE_WINDOW, window_params)
        claimed, oldest, now_ms = window[0]
        room = count - int(claimed)
        if room <= 0 and oldest is not None:
            # When the oldest claim leaves the window, on the local clock.
            frees_in = int(oldest) + period_ms - int(now_ms)
            self.options.queues_full_until[queue] = _local_clock_ms() + max(0, frees_in)
        return room


def _local_clock_ms() -> float:
    """A local stand-in for the database clock's progress (ms): monotonic time plus the
    test clock's offset, so a hint follows ``ControllableClock.advance`` too."""
    return time.monotonic() * 1000 + clock_offset_ms()
