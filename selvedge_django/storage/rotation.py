"""Key rotation: stored values re-encrypted under the first of ``PAYLOAD_KEYS``.

Every column that holds user values is walked in primary-key order, ``batch``
rows at a time, each batch in its own transaction; a row is rewritten only when
one of its envelopes (at any depth: an error envelope's ``sealed`` part, a
nested ``last_error``) is under another key, and only if the column still holds
what was read (a value written meanwhile is left to the next run). So a run
stopped half-way leaves every value readable (under the old key or the new),
and a second run goes on where the first stopped: what is done is skipped
without a write. Plain values written before a codec was configured are left as
they are (each stored value says how it was encoded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import models

from .. import exceptions as exc
from ..engine.codec import ENVELOPE_CODEC, Codec, is_envelope
from ..models import (
    ActivityTask,
    ArchivedHistoryEvent,
    HistoryEvent,
    Schedule,
    SignalMessage,
    WorkflowInstance,
)
from .db import Database
from .operation import operation

__all__ = ["COLUMNS", "KeyRotation", "RotationCounts"]

# The model and columns holding user values; JSON columns hold decoded JSON.
COLUMNS: tuple[tuple[type[models.Model], tuple[str, ...], tuple[str, ...]], ...] = (
    # (model, text columns, JSON columns)
    (WorkflowInstance, ("output", "error", "progress"), ("input",)),
    (HistoryEvent, ("data",), ()),
    (ArchivedHistoryEvent, ("data", "task"), ()),
    (ActivityTask, ("input", "last_error", "heartbeat_details"), ()),
    (SignalMessage, ("payload",), ()),
    (Schedule, (), ("input",)),
)
# A JSON column is rewritten only if this column still holds what was read with it:
# an instance's input changes only with its generation (continue-as-new), a
# schedule's with its version.
GUARDS: dict[type[models.Model], str] = {WorkflowInstance: "generation", Schedule: "version"}


@dataclass
class RotationCounts:
    """What a rotation did: values re-encrypted, and values no key of this process opens."""

    changed: int = 0
    undecodable: int = 0


def _reseal_tree(codec: Codec, value: Any, counts: RotationCounts) -> tuple[Any, bool]:
    """``value`` with every envelope under another key sealed again under the first."""
    if is_envelope(value):
        try:
            resealed = codec.reseal_value(value)
        except exc.PayloadDecodeError:
            counts.undecodable += 1
            return value, False
        return (value, False) if resealed is None else (resealed, True)
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            out[key], one = _reseal_tree(codec, item, counts)
            changed = changed or one
        return out, changed
    if isinstance(value, str) and value.startswith("{") and f'"{ENVELOPE_CODEC}"' in value:
        # JSON kept as text inside a value (an archived task's last error): decoded, its
        # quotes are plain again.
        try:
            inner = json.loads(value)
        except ValueError:
            return value, False
        inner, changed = _reseal_tree(codec, inner, counts)
        return (json.dumps(inner), True) if changed else (value, False)
    if isinstance(value, list):
        changed = False
        items = []
        for item in value:
            new, one = _reseal_tree(codec, item, counts)
            items.append(new)
            changed = changed or one
        return items, changed
    return value, False


class KeyRotation:
    """``runselvedge rotate-keys``: bounded, resumable batches over every value column."""

    def __init__(self, db: Database, codec: Codec) -> None:
        self.db = db
        self.codec = codec

    @operation
    def run(
        self, batch: int, progress: Callable[[RotationCounts], None] | None = None
    ) -> RotationCounts:
        """Re-encrypt every stored envelope that is not under the first key."""
        counts = RotationCounts()
        if self.codec.payload is None:
            return counts
        for model, text_columns, json_columns in COLUMNS:
            for _ in self._batches(model, text_columns, json_columns, batch, counts):
                if progress is not None:
                    progress(counts)
        return counts

    def _batches(
        self,
        model: type[models.Model],
        text_columns: tuple[str, ...],
        json_columns: tuple[str, ...],
        batch: int,
        counts: RotationCounts,
    ) -> Iterator[None]:
        rows = model._default_manager.using(self.db.alias)
        pk = model._meta.pk
        assert pk is not None
        marked = models.Q()
        for column in text_columns:
            # Not quoted: an envelope inside JSON kept as text has its quotes escaped.
            marked |= models.Q(**{f"{column}__contains": ENVELOPE_CODEC})
        guard = GUARDS.get(model)
        columns = (*text_columns, *json_columns, *((guard,) if guard else ()))
        last: Any = None
        while True:
            with self.db.atomic():
                selected = rows.order_by(pk.name)
                if last is not None:
                    selected = selected.filter(pk__gt=last)
                if not json_columns:
                    selected = selected.filter(marked)
                page = list(selected.values_list(pk.name, *columns)[:batch])
                for row in page:
                    self._reseal_row(rows, pk.name, row, text_columns, json_columns, guard, counts)
            if not page:
                return
            last = page[-1][0]
            yield None

    def _reseal_row(
        self,
        rows: Any,
        pk_name: str,
        row: tuple[Any, ...],
        text_columns: tuple[str, ...],
        json_columns: tuple[str, ...],
        guard: str | None,
        counts: RotationCounts,
    ) -> None:
        key = row[0]
        columns = (*text_columns, *json_columns)
        values = row[1 : 1 + len(columns)]
        guarded = {} if guard is None else {guard: row[-1]}
        for column, old in zip(columns, values, strict=True):
            if old is None:
                continue
            if column in text_columns:
                if ENVELOPE_CODEC not in old:
                    continue
                try:
                    parsed = json.loads(old)
                except ValueError:
                    continue
                new, changed = _reseal_tree(self.codec, parsed, counts)
                if changed and rows.filter(**{pk_name: key, column: old}).update(
                    **{column: json.dumps(new, separators=(",", ":"), ensure_ascii=False)}
                ):
                    counts.changed += 1
            else:
                new, changed = _reseal_tree(self.codec, old, counts)
                if changed and rows.filter(**{pk_name: key}, **guarded).update(**{column: new}):
                    counts.changed += 1
