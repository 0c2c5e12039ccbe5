"""The storage package's own rules: one dialect per subclass, named statements, marked
operations, bounded modules, and a LISTEN thread shared by reference."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from django.db import connection

import selvedge_django
from selvedge_django import storage
from selvedge_django.engine.codec import Codec
from selvedge_django.storage.operation import OPERATIONS
from selvedge_django.storage.store import Store

PACKAGE = Path(selvedge_django.__file__).parent
# The dialect packages: everything database-specific lives under one of them.
DIALECTS = ("storage/postgresql/", "storage/sqlite/")
# What a dialect test looks like: a vendor comparison, or a capability branch.
DIALECT_TEST = re.compile(r"vendor\s*[!=]=|\bone_statement\b|can_return_columns_from_insert")
SQL_WORDS = re.compile(r"\b(SELECT|UPDATE|INSERT INTO|DELETE FROM)\b")


def _modules(folder: str = "") -> list[Path]:
    root = PACKAGE / folder
    return sorted(p for p in root.rglob("*.py") if "migrations" not in p.parts)


def test_no_module_tests_the_database_outside_the_dialect_packages() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _modules()
        if not str(path.relative_to(PACKAGE)).startswith(DIALECTS)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if DIALECT_TEST.search(line)
    ]
    assert not found, "\n".join(found)


def test_statements_are_built_only_in_sql_py_and_the_dialect_packages() -> None:
    """No string literal inside a function of a storage part holds SQL (docstrings aside)."""
    found = []
    for path in _modules("storage"):
        relative = str(path.relative_to(PACKAGE))
        if relative == "storage/sql.py" or relative.startswith(DIALECTS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            docstring = ast.get_docstring(function, clean=False)
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value != docstring
                    and SQL_WORDS.search(node.value)
                ):
                    found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "\n".join(found)


def test_every_public_store_method_is_a_marked_operation() -> None:
    """The fault injector names statements after marked operations: a new public method
    of a store class, of one of its parts or of its database that was not marked would
    issue statements named after nothing."""
    stores = [
        cls(connection.alias, Codec()) for cls in (storage.PostgresStore, storage.SQLiteStore)
    ]
    classes = {
        cls
        for store in stores
        for owner in (store, store.db, *(v for v in vars(store).values() if hasattr(v, "db")))
        for cls in type(owner).__mro__
        if cls.__module__.startswith("selvedge_django.storage")
    }
    unmarked = sorted(
        f"{cls.__name__}.{name}"
        for cls in classes
        for name, attr in vars(cls).items()
        if not name.startswith("_")
        and inspect.isfunction(attr)
        and getattr(attr, "__wrapped__", attr).__code__ not in OPERATIONS
    )
    assert unmarked == []
    assert len(classes) > 20
    assert "complete_task" in OPERATIONS.values()


def test_store_for_picks_the_class_of_the_database(tdb: None) -> None:
    store = storage.store_for(connection.alias, Codec())
    assert isinstance(store, Store)
    assert type(store) is storage.STORES[connection.vendor]
    assert type(store) is not Store
    assert type(store.db) is type(store).database


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="LISTEN exists on PostgreSQL only")
def test_the_listener_stops_with_its_last_reference(tdb: None) -> None:
    from selvedge_django.storage.postgresql import listener
    from selvedge_django.storage.wakeups import Bus

    bus = Bus()
    first = listener.acquire_listener(connection.alias, bus)
    second = listener.acquire_listener(connection.alias, bus)
    try:
        assert first is second
        assert listener.wait_until_connected(first, 10)
        listener.release_listener(first)
        assert first._thread is not None and first._thread.is_alive()
    finally:
        listener.release_listener(second)
    assert first._thread is not None and not first._thread.is_alive()
    # A process-long reference (the client API's waits) is taken once and kept.
    kept = listener.ensure_listener(connection.alias, bus)
    try:
        assert listener.ensure_listener(connection.alias, bus) is kept
        worker = listener.acquire_listener(connection.alias, bus)
        listener.release_listener(worker)
        assert kept._thread is not None and kept._thread.is_alive()
    finally:
        listener.stop_listeners()
