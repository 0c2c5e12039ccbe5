"""Group commit: the outcomes of attempts that finish together, in one transaction.

Every commit waits for the disk, and on SQLite one writer holds the database at a
time, so ten attempts that finish together would take ten commits (on SQLite the
write lock ten times, one after another, while every other process, the web process
enqueueing tasks say, waits with the busy handler's growing sleeps). Their outcomes
are claim-checked conditional writes that do not depend on each other, so a worker
commits the ones waiting at the same moment together: the first thread to find no
batch being written writes every outcome waiting then, each as its own operation, in
one transaction; the others' writes are done when it commits, and the writes that
arrive while it writes wait for the next batch. A batch that fails (a statement error,
a lost connection) is rolled back whole and each thread writes its own outcome again
in a transaction of its own, on its own connection, as it would have without a
batch; so a batch never turns one outcome's error into another's.

A write in a batch never waits for a row another transaction holds (a caller's
``select_for_update`` of an instance, on PostgreSQL): it raises
:class:`~selvedge_django.storage.errors.RowBusy` having written nothing, the batch
goes on without it, and its thread writes it alone once the batch is done, so a held
row delays only its own outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..storage import RowBusy, Store

__all__ = ["GroupCommit"]

T = TypeVar("T")


@dataclass
class _Write(Generic[T]):
    write: Callable[[], T]
    batched: Callable[[], T]  # the write as one of a batch: may raise RowBusy
    done: bool = False  # written, or left to write alone (set and read under the turn)
    result: Any = None
    written: bool = False  # False once done: the batch failed, write it alone


class GroupCommit:
    """Commit the writes submitted while a batch is being written in the next batch."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._waiting: list[_Write[Any]] = []
        self._writing = threading.Lock()  # held by the thread writing a batch

    def submit(self, write: Callable[[], T], batched: Callable[[], T] | None = None) -> T:
        """Run ``write`` (one store operation) in the next batch; return its result.

        ``batched`` is the same write as one of a batch (in its transaction, or alone
        under the turn), which raises RowBusy rather than wait for a row another
        transaction holds; ``write`` then runs alone, outside the turn. Raises what
        ``write`` raises when it runs alone (after a failed batch, or a busy row).
        """
        entry: _Write[T] = _Write(write, write if batched is None else batched)
        with self._lock:
            self._waiting.append(entry)
        with self._writing:
            if not entry.done:
                with self._lock:
                    batch, self._waiting = self._waiting, []
                if len(batch) <= 1:
                    # Alone: its own transaction, still holding the turn, so that the
                    # writes that arrive meanwhile wait for it and go in the next batch.
                    for other in batch:
                        other.done = True
                    try:
                        return entry.batched()
                    except RowBusy:
                        pass  # alone after all, without the turn (below)
                else:
                    self._write(batch)
        if entry.written:
            return entry.result
        # A failed batch, one whose writer was interrupted, or a busy row: alone, in
        # parallel.
        return write()

    def _write(self, batch: list[_Write[Any]]) -> None:
        busy = object()
        try:
            with self._store.atomic():
                results = [self._batched(entry, busy) for entry in batch]
        except Exception:
            results = None  # rolled back: each writes its own
        for index, entry in enumerate(batch):
            if results is not None and results[index] is not busy:
                entry.result, entry.written = results[index], True
            entry.done = True

    @staticmethod
    def _batched(entry: _Write[Any], busy: object) -> Any:
        """One write of a batch; ``busy`` when its row is held (nothing was written)."""
        try:
            return entry.batched()
        except RowBusy:
            return busy
