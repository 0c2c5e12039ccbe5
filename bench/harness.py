"""Shared benchmark plumbing: a throwaway database and SQL/transaction counting.

``bench_database(db)`` configures Django with ``bench/settings.py`` on a fresh
SQLite file in a temporary directory or a fresh PostgreSQL database it creates,
runs the migrations, and removes the file or drops the database on the way out.
Django is set up once per process, so a process benchmarks one database.

``SqlCounter`` counts, on every connection of every thread:

* statements, through ``connection.execute_wrapper`` hooks installed on the
  connections already open and, through the ``connection_created`` signal, on
  every connection opened later (worker threads open their own);
* transactions, by wrapping each connection's ``commit()`` and ``rollback()``
  (Django calls them once per outermost ``atomic`` block), plus the statements
  run in autocommit mode, each of which is a transaction of its own.

Each statement and commit is charged to the outermost tracked store method
running on its thread (``track``), so the figures split by durable operation.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

UNTRACKED = "(outside the store)"

_TX_CONTROL = re.compile(r"^\s*(BEGIN|SAVEPOINT|RELEASE|ROLLBACK)\b", re.IGNORECASE)
_DATA = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)
_TABLE = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?([A-Za-z0-9_]+)"?', re.IGNORECASE)


def statement_kind(sql: str) -> str:
    """Classify a statement: query, begin, savepoint or other (PRAGMA, SET ...)."""
    match = _TX_CONTROL.match(sql)
    if match:
        return "begin" if match.group(1).upper() == "BEGIN" else "savepoint"
    if _DATA.match(sql):
        return "query"
    return "other"


def statement_shape(sql: str) -> str:
    """A short name for a statement: its verb and first table (``UPDATE workflowinstance``)."""
    words = sql.split(None, 1)
    verb = words[0].upper() if words else "?"
    if statement_kind(sql) != "query":
        # Savepoint names differ on every call: keep the keywords only.
        return " ".join(word for word in sql.split() if word.isalpha()).upper()
    match = _TABLE.search(sql)
    table = match.group(1) if match else ""
    table = table.removeprefix("selvedge_django_")
    if verb == "SELECT" and "pg_notify" in sql:
        return "SELECT pg_notify"
    if verb == "SELECT" and "FOR UPDATE" in sql.upper():
        verb = "SELECT FOR UPDATE"
    return f"{verb} {table}".strip()


class SqlCounter:
    """Count statements and transactions per store operation, across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.by_op: dict[str, Counter[str]] = defaultdict(Counter)
        self.calls: Counter[str] = Counter()
        self.shapes: dict[str, Counter[str]] = defaultdict(Counter)
        self.trace: list[tuple[str, str]] | None = None

    # -- installing -----------------------------------------------------------------

    def install(self) -> None:
        """Instrument every connection open now and every one opened later."""
        from django.db import connections
        from django.db.backends.signals import connection_created

        connection_created.connect(self._on_created, weak=False, dispatch_uid=f"bench-{id(self)}")
        for conn in connections.all(initialized_only=True):
            self._instrument(conn)

    def _on_created(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        self._instrument(connection)

    def _instrument(self, conn: Any) -> None:
        # connection_created fires again when a wrapper reconnects: instrument once.
        if getattr(conn, "_bench_counter", None) is self:
            return
        conn._bench_counter = self
        conn.execute_wrappers.append(self._execute)
        commit, rollback = conn.commit, conn.rollback

        def counted_commit() -> None:
            self._add("commits")
            commit()

        def counted_rollback() -> None:
            self._add("rollbacks")
            rollback()

        conn.commit = counted_commit
        conn.rollback = counted_rollback

    def track(self, cls: type, names: Iterable[str]) -> None:
        """Charge what the named methods of ``cls`` run to the outermost one on the thread."""
        for name in names:
            original = getattr(cls, name, None)
            if original is None or getattr(original, "_bench_tracked", False):
                continue
            setattr(cls, name, self._tracked(name, original))

    def _tracked(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = local.__dict__.setdefault("ops", [])
            if not stack:
                with self._lock:
                    self.calls[name] += 1
            stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                stack.pop()

        wrapper._bench_tracked = True  # type: ignore[attr-defined]
        return wrapper

    # -- counting -------------------------------------------------------------------

    def _op(self) -> str:
        stack = self._local.__dict__.get("ops")
        return stack[0] if stack else UNTRACKED

    def _add(self, field: str) -> None:
        op = self._op()
        with self._lock:
            self.by_op[op][field] += 1

    def _execute(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        kind = statement_kind(sql)
        op = self._op()
        autocommit = kind == "query" and bool(context["connection"].autocommit)
        with self._lock:
            counts = self.by_op[op]
            counts["queries" if kind == "query" else kind] += 1
            if autocommit:
                counts["autocommit"] += 1
            self.shapes[op][statement_shape(sql)] += 1
            if self.trace is not None:
                self.trace.append((op, sql))
        return execute(sql, params, many, context)

    def reset(self) -> None:
        with self._lock:
            self.by_op.clear()
            self.calls.clear()
            self.shapes.clear()

    def snapshot(self) -> tuple[dict[str, Counter[str]], Counter[str], dict[str, Counter[str]]]:
        """Return copies of (counts by op, outermost calls by op, statement shapes by op)."""
        with self._lock:
            return (
                {op: Counter(c) for op, c in self.by_op.items()},
                Counter(self.calls),
                {op: Counter(c) for op, c in self.shapes.items()},
            )


def store_classes(alias: str = "default") -> list[type]:
    """The classes whose methods run the SQL of ``alias``'s store: the store class, its
    database's and its parts' (a store holds its parts as members)."""
    from selvedge_django.engine.codec import Codec
    from selvedge_django.storage import check_vendor

    store = check_vendor(alias)(alias, Codec())
    parts = [value for value in vars(store).values() if hasattr(value, "db")]
    return [type(store), type(store.db), *(type(part) for part in parts)]


def transactions(counts: Counter[str]) -> int:
    """Commits, rollbacks and autocommit statements: every transaction the database ran."""
    return counts["commits"] + counts["rollbacks"] + counts["autocommit"]


# -- the database ---------------------------------------------------------------------


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(
        host=os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
        port=os.environ.get("SELVEDGE_PG_PORT", "5432"),
        user=os.environ.get("SELVEDGE_PG_USER", "postgres"),
        password=os.environ.get("SELVEDGE_PG_PASSWORD", ""),
        dbname="postgres",
        autocommit=True,
        connect_timeout=5,
    ) as conn:
        conn.execute(sql)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def each_database(script: str, options: list[str]) -> int:
    """Run ``script --db D <options>`` once for SQLite, once for PostgreSQL; 1 if either fails.

    One process per database: Django is configured once per process.
    """
    failed = []
    for db in ("sqlite", "postgres"):
        command = [sys.executable, str(Path(script).resolve()), "--db", db, *options]
        if subprocess.call(command) != 0:
            failed.append(db)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def bench_database(db: str, settings_module: str = "bench.settings") -> Iterator[dict[str, str]]:
    """Set Django up on a fresh database, migrate it, and remove it afterwards."""
    if str(REPO_ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(REPO_ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    os.environ["SELVEDGE_BENCH_DB"] = db
    info: dict[str, str] = {"db": db}
    tmpdir: str | None = None
    pg_name: str | None = None
    try:
        if db == "sqlite":
            tmpdir = tempfile.mkdtemp(prefix="selvedge-bench-")
            os.environ["SELVEDGE_BENCH_SQLITE"] = str(Path(tmpdir) / "bench.sqlite3")
        elif db == "postgres":
            pg_name = os.environ.setdefault(
                "SELVEDGE_BENCH_PG_NAME", f"selvedge_bench_{os.getpid()}"
            )
            # A leftover from an interrupted run is the benchmark's own: start clean.
            _pg_admin(f"DROP DATABASE IF EXISTS {_quote(pg_name)} WITH (FORCE)")
            _pg_admin(f"CREATE DATABASE {_quote(pg_name)}")
        else:
            raise ValueError(f"unknown database {db!r}")

        import django
        from django.core.management import call_command
        from django.db import connection

        django.setup()
        call_command("migrate", verbosity=0, interactive=False)
        with connection.cursor() as cursor:
            if db == "sqlite":
                cursor.execute("SELECT sqlite_version()")
                info["version"] = f"SQLite {cursor.fetchone()[0]}"
            else:
                cursor.execute("SHOW server_version")
                info["version"] = f"PostgreSQL {cursor.fetchone()[0]}"
        yield info
    finally:
        if "django.db" in sys.modules:
            from django.db import connections

            connections.close_all()
        if pg_name is not None:
            _pg_admin(f"DROP DATABASE IF EXISTS {_quote(pg_name)} WITH (FORCE)")
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
