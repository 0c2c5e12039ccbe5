"""Bulk starts on SQLite: one statement run for every row of a batch (``executemany``).

A multi-row ``VALUES`` list is one long text that Django rewrites mark by mark and
SQLite parses again for every batch; ``executemany`` prepares one row's statement
once and binds each row's values in C. It returns no rows, so the ids a batch
inserted are known from its row count: all of them when it inserted as many rows as
it was given (the usual case), else the rows past the largest rowid read before the
batch, in the same write transaction (SQLite has one writer, so those are this
batch's). The creation numbers follow that rowid too, read once per batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .. import sql
from ..bulk_starts import INSERT_INSTANCES, INSERT_ROWS, BulkStarts, NewInstance
from ..columns import Column, Const, layout

__all__ = ["SQLiteBulkStarts"]

# The largest rowid of the instances (the creation numbers of a bulk start follow it).
MAX_ROWID = "SELECT COALESCE(MAX(rowid), 0) FROM {instance}"
# The ids of the instances past a rowid: those a batch inserted after reading it.
INSERTED_SINCE = "SELECT instance_id FROM {instance} WHERE rowid > %s ORDER BY rowid"


class SQLiteBulkStarts(BulkStarts):
    """Bulk starts on SQLite: ``executemany`` within the library's own parameter limit,
    and creation numbers read once per batch."""

    def _max_params(self) -> int:
        """The connection's limit (32,766 by default since SQLite 3.32; Django's features
        say 999 whatever the library)."""
        conn = self.db.connection
        conn.ensure_connection()
        return int(conn.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))

    def _next_seqs(self, count: int) -> Column:
        """Read the largest rowid once, inside the write transaction that inserts the rows
        (the one writer): evaluated per row, NEXT_SEQ_SQLITE's subquery makes a large
        insert slower with every row it adds."""
        (base,) = self.db._fetch(MAX_ROWID, [])[0]
        return [int(base or 0) + offset + 1 for offset in range(count)]

    def _input_column(self, batch: Sequence[NewInstance]) -> list[Any]:
        # A JSON column is text here: the stored JSON text as it is (compact, where the
        # field would write spaces; a reader decodes either the same).
        texts = self._stored_texts(batch)
        return super()._input_column(batch) if texts is None else texts

    def _write_instances(
        self, columns: dict[str, Column], count: int, *, fresh: bool = False
    ) -> list[str]:
        # _next_seqs: the largest rowid read, plus 1, 2, ... (one row: a Const).
        seqs = columns["created_seq"]
        first_seq = seqs.value if isinstance(seqs, Const) else seqs[0]  # type: ignore[index]
        names, marks, params = layout(self.db.connection, columns, count)
        statement = sql.compose(INSERT_INSTANCES, columns=names, rows=marks)
        if self._execute_many(statement, params) == count:
            ids = columns["instance_id"]
            return [ids.value] if isinstance(ids, Const) else list(ids)  # type: ignore[arg-type]
        return [str(row[0]) for row in self.db._fetch(INSERTED_SINCE, [first_seq - 1])]

    def _write_rows(self, model: Any, columns: dict[str, Column], count: int) -> None:
        names, marks, params = layout(self.db.connection, columns, count)
        table = self.db.connection.ops.quote_name(model._meta.db_table)
        self._execute_many(sql.compose(INSERT_ROWS, table=table, columns=names, rows=marks), params)

    def _execute_many(self, statement: str, params: list[Any]) -> int:
        """Run ``statement`` once for each row (the columns of ``params`` zipped); the
        rows it inserted."""
        db = self.db
        with db._cursor() as cursor:
            cursor.executemany(db._tables(statement, named=False), list(zip(*params, strict=True)))
            return int(cursor.rowcount)
