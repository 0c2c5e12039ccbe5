"""The fault injector: chosen database statements fail, or the process ends around them.

Statements are attributed to the outermost *store operation* on the stack: the
store's methods marked with :func:`selvedge_django.storage.operation.operation`
(``operation="complete_task"`` in a :class:`Fault`), not whatever module they
live in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from django.db import OperationalError

__all__ = [
    "FAULTS_ENV",
    "FAULT_EXIT_STATUS",
    "Fault",
    "FaultInjector",
    "FaultSelectors",
    "InjectedFault",
    "Statement",
    "install_faults_from_env",
]

#: The environment variable :meth:`FaultInjector.to_env` writes and
#: :func:`install_faults_from_env` reads (JSON), to arm faults in a worker subprocess.
FAULTS_ENV = "SELVEDGE_FAULTS"

#: The exit status of a process that a fault stopped with ``os._exit``.
FAULT_EXIT_STATUS = 75

_ACTIONS = ("fail", "exit", "exit_after_commit", "fail_after_commit")
# Actions that strike once the statement has run (and its transaction committed).
_AFTER_ACTIONS = ("exit_after_commit", "fail_after_commit")
# Transaction control and connection set-up are no statements "whose transaction
# commits": after-commit actions pass over them (a BEGIN runs before Django's side of the
# transaction is open; a new connection's PRAGMA or SET runs inside whatever opened it).
_CONTROL = re.compile(r"^\s*(BEGIN|SAVEPOINT|RELEASE|ROLLBACK|COMMIT|PRAGMA|SET)\b", re.IGNORECASE)


class InjectedFault(OperationalError):
    """The database error a :class:`FaultInjector` raises instead of running a statement."""


@dataclass
class Statement:
    """One statement a :class:`FaultInjector` saw (kept when tracing)."""

    operation: str | None
    instance_id: str | None
    call: int
    step: int
    sql: str
    params: str
    thread: str

    @property
    def waiter_hint(self) -> bool:
        """Whether this is a wake-up for waiters that its operation sends after it
        committed (a close's or a stream entry's NOTIFY on PostgreSQL): not a step of
        the operation's transaction, and failing it loses nothing."""
        words = self.sql.split(" ", 2)  # a statement of pg_notify() calls alone
        notifies_only = len(words) > 1 and words[1].startswith("pg_notify(")
        return notifies_only and (" closed:" in self.params or " stream:" in self.params)


@dataclass
class Fault:
    """Where a fault strikes and what it does; ``hits`` and ``fired`` count what happened.

    A statement matches when every selector given matches: ``operation`` (the
    store operation running it, e.g. ``"complete_task"``), ``instance_id`` (the
    instance that operation acts on), ``pattern`` (a regular expression searched
    in the SQL text) and ``step`` (its position, from 1, within one call of the
    operation); for ``exit_after_commit`` and ``fail_after_commit`` (which pass
    over transaction control and connection set-up: BEGIN, SAVEPOINT, RELEASE,
    ROLLBACK, COMMIT, PRAGMA, SET) also ``min_rows`` (the statement changed or
    returned at least that many rows, such as a poll that found work). The
    ``nth`` matching statement, and the ``times - 1`` after it, trigger the action.
    """

    action: str
    pattern: str | None = None
    nth: int = 1
    operation: str | None = None
    instance_id: str | None = None
    step: int | None = None
    times: int = 1
    min_rows: int | None = None
    error: BaseException | type[BaseException] | None = None
    hits: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}")
        if self.nth < 1 or self.times < 1:
            raise ValueError("nth and times count from 1")
        if self.min_rows is not None and self.action not in _AFTER_ACTIONS:
            raise ValueError(
                "min_rows is known only after the statement ran (exit_after_commit,"
                " fail_after_commit)"
            )
        self._regex = re.compile(self.pattern, re.IGNORECASE | re.DOTALL) if self.pattern else None

    def matches(self, statement: Statement) -> bool:
        if self.operation is not None and statement.operation != self.operation:
            return False
        if self.instance_id is not None and statement.instance_id != self.instance_id:
            return False
        if self.step is not None and statement.step != self.step:
            return False
        return self._regex is None or self._regex.search(statement.sql) is not None

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            raise ValueError("a fault with a custom error cannot be sent to another process")
        return {
            "action": self.action,
            "pattern": self.pattern,
            "nth": self.nth,
            "operation": self.operation,
            "instance_id": self.instance_id,
            "step": self.step,
            "times": self.times,
            "min_rows": self.min_rows,
        }


class FaultSelectors(TypedDict, total=False):
    """The keyword arguments of :class:`FaultInjector`'s methods: :class:`Fault`'s selectors."""

    operation: str | None
    instance_id: str | None
    step: int | None
    times: int
    min_rows: int | None


class FaultInjector:
    """Make chosen database statements fail, or end the process around them.

    Built on Django's ``connection.execute_wrapper``: once :meth:`install`\\ ed, the
    injector wraps every connection of this process opened from then on (and
    the calling thread's), so install it before starting workers. Faults:

    * :meth:`fail_statement`: raise an exception (default :class:`InjectedFault`,
      an ``OperationalError``) instead of running the statement;
    * :meth:`exit_at_statement`: ``os._exit`` before the statement runs (the
      database rolls back the open transaction, as after a crash);
    * :meth:`exit_after_commit`: run the statement, then ``os._exit`` as soon as
      its transaction commits (at once outside a transaction).
    * :meth:`fail_after_commit`: run the statement and let its transaction commit,
      then raise :class:`InjectedFault` to the caller, as a connection lost before
      the answer to its COMMIT arrived would: an ambiguous commit.

    With ``trace=True`` every statement is kept in :attr:`statements` with the
    store operation, instance, call number and step that issued it. Use
    :meth:`to_env` and :func:`install_faults_from_env` to arm a subprocess.
    """

    def __init__(self, *, trace: bool = False) -> None:
        self.faults: list[Fault] = []
        self.trace = trace
        self.statements: list[Statement] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._calls: dict[str, int] = {}
        self._attached: weakref.WeakSet[Any] = weakref.WeakSet()
        self._installed = False

    # -- arming -----------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def fail_statement(
        self,
        pattern: str | None = None,
        nth: int = 1,
        exc: BaseException | type[BaseException] | None = None,
        **selectors: Unpack[FaultSelectors],
    ) -> Fault:
        """Raise ``exc`` instead of running the ``nth`` matching statement."""
        return self.add(Fault("fail", pattern, nth, error=exc, **selectors))

    def exit_at_statement(
        self, pattern: str | None = None, nth: int = 1, **selectors: Unpack[FaultSelectors]
    ) -> Fault:
        """End the process (``os._exit``) just before the ``nth`` matching statement."""
        return self.add(Fault("exit", pattern, nth, **selectors))

    def exit_after_commit(
        self, pattern: str | None = None, nth: int = 1, **selectors: Unpack[FaultSelectors]
    ) -> Fault:
        """End the process right after the ``nth`` matching statement's transaction commits."""
        return self.add(Fault("exit_after_commit", pattern, nth, **selectors))

    def fail_after_commit(
        self, pattern: str | None = None, nth: int = 1, **selectors: Unpack[FaultSelectors]
    ) -> Fault:
        """Let the ``nth`` matching statement run and its transaction commit, then raise
        :class:`InjectedFault` (an ``OperationalError``) where the COMMIT returns.

        The caller sees the error a lost connection gives, although everything was
        written (at once for a statement outside a transaction; inside one, from the
        outermost ``atomic()`` block as it commits, before the later ``on_commit``
        callbacks of that transaction run).
        """
        return self.add(Fault("fail_after_commit", pattern, nth, **selectors))

    # -- installing -------------------------------------------------------------------

    def install(self) -> FaultInjector:
        """Wrap the calling thread's connections and every connection opened later."""
        from django.db import connections
        from django.db.backends.signals import connection_created

        self._installed = True
        connection_created.connect(self._on_connection_created, weak=False, dispatch_uid=id(self))
        for conn in connections.all():
            self._attach(conn)
        return self

    def uninstall(self) -> None:
        """Stop injecting faults and unwrap the connections seen so far."""
        from django.db.backends.signals import connection_created

        self._installed = False
        connection_created.disconnect(dispatch_uid=id(self))
        for conn in list(self._attached):
            with contextlib.suppress(ValueError):
                conn.execute_wrappers.remove(self._wrap)

    def __enter__(self) -> FaultInjector:
        return self.install()

    def __exit__(self, *exc_info: Any) -> None:
        self.uninstall()

    def _on_connection_created(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if self._installed:
            self._attach(connection)

    def _attach(self, conn: Any) -> None:
        if self._wrap not in conn.execute_wrappers:
            conn.execute_wrappers.append(self._wrap)
            self._attached.add(conn)

    # -- across processes ---------------------------------------------------------------

    def to_env(self) -> dict[str, str]:
        """The environment that arms these faults in a subprocess (see FAULTS_ENV)."""
        return {FAULTS_ENV: json.dumps([fault.to_json() for fault in self.faults])}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultInjector | None:
        """Build the injector described by ``FAULTS_ENV``, or None when it is unset."""
        raw = (os.environ if environ is None else environ).get(FAULTS_ENV)
        if not raw:
            return None
        injector = cls()
        for spec in json.loads(raw):
            injector.add(Fault(**spec))
        return injector

    # -- the wrapper ----------------------------------------------------------------------

    def _statement(self, sql: str, params: Any) -> Statement:
        operation, instance_id, frame = _store_operation(sys._getframe(2))
        local = self._local
        call = getattr(local, "call", 0)
        step = getattr(local, "step", 0) + 1
        if operation is None:
            local.frame = None
            call, step = 0, 0
        elif frame is not getattr(local, "frame", None):
            # A new call. Holding the frame keeps its identity from being reused.
            local.frame = frame
            with self._lock:
                call = self._calls[operation] = self._calls.get(operation, 0) + 1
            local.call = call
            step = 1
        local.step = step
        return Statement(
            operation=operation,
            instance_id=instance_id,
            call=call,
            step=step,
            sql=sql,
            params=repr(params)[:500],
            thread=threading.current_thread().name,
        )

    def _wrap(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not self._installed:
            return execute(sql, params, many, context)
        statement = self._statement(sql, params)
        with self._lock:
            if self.trace:
                self.statements.append(statement)
            action = self._strike(statement, before=True)
        if action is None:
            result = execute(sql, params, many, context)
            rows = getattr(context["cursor"], "rowcount", -1)
            with self._lock:
                action = self._strike(statement, before=False, rows=rows)
            if action is None:
                return result
            if action.action == "fail_after_commit":
                self._fail_after_commit(context["connection"], statement)
                return result
            self._exit_after_commit(context["connection"], statement)
            return result
        if action.action == "fail":
            error = action.error
            if error is None:
                error = InjectedFault(
                    f"injected fault at {statement.operation or 'statement'} "
                    f"step {statement.step}: {sql[:200]}"
                )
            elif isinstance(error, type):
                error = error(f"injected fault: {sql[:200]}")
            raise error
        _exit_now(f"before {statement.operation} step {statement.step}")
        raise AssertionError("unreachable")  # pragma: no cover

    def _strike(self, statement: Statement, *, before: bool, rows: int = -1) -> Fault | None:
        """Count the statement against the faults acting at this moment; return one to fire."""
        for fault in self.faults:
            if (fault.action not in _AFTER_ACTIONS) != before or not fault.matches(statement):
                continue
            if not before and _CONTROL.match(statement.sql):
                continue
            if fault.min_rows is not None and rows < fault.min_rows:
                continue
            fault.hits += 1
            if fault.nth <= fault.hits < fault.nth + fault.times:
                fault.fired += 1
                return fault
        return None

    @staticmethod
    def _fail_after_commit(conn: Any, statement: Statement) -> None:
        where = f"{statement.operation or 'statement'} step {statement.step}"

        def lost() -> None:
            raise InjectedFault(f"injected fault: connection lost after the commit of {where}")

        if conn.in_atomic_block:
            from django.db import transaction

            # A callback that raises (robust=False) propagates out of the atomic block
            # that commits, after the COMMIT, and drops the callbacks registered after it.
            transaction.on_commit(lost, using=conn.alias)
        else:
            lost()

    @staticmethod
    def _exit_after_commit(conn: Any, statement: Statement) -> None:
        if conn.in_atomic_block:
            from django.db import transaction

            where = f"after the commit of {statement.operation} step {statement.step}"
            transaction.on_commit(lambda: _exit_now(where), using=conn.alias)
        else:
            _exit_now(f"after {statement.operation} step {statement.step} (autocommit)")


def _store_operation(frame: Any) -> tuple[str | None, str | None, Any]:
    """The outermost store operation on the stack, the instance it acts on, its frame.

    Store operations are the methods marked with
    :func:`selvedge_django.storage.operation.operation` (their code objects).
    """
    from ..storage.operation import OPERATIONS

    found: tuple[str | None, str | None, Any] = (None, None, None)
    while frame is not None:
        name = OPERATIONS.get(frame.f_code)
        if name is not None:
            found = (name, _instance_of(frame.f_locals), frame)
        frame = frame.f_back
    return found


def _instance_of(local_vars: Mapping[str, Any]) -> str | None:
    for name in ("fence", "claim"):
        holder = local_vars.get(name)
        instance_id = getattr(holder, "instance_id", None)
        if isinstance(instance_id, str):
            return instance_id
    value = local_vars.get("instance_id")
    return value if isinstance(value, str) else None


def _exit_now(where: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"selvedge fault injector: exiting {where}\n".encode())
    os._exit(FAULT_EXIT_STATUS)


def install_faults_from_env(environ: Mapping[str, str] | None = None) -> FaultInjector | None:
    """Install the faults ``FAULTS_ENV`` describes (in a worker subprocess); None if unset."""
    injector = FaultInjector.from_env(environ)
    return injector.install() if injector is not None else None
