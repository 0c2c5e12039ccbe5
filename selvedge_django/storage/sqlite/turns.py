"""SQLite's writers take turns: within a process on a lock, between processes on a file.

SQLite lets one writer in at a time and makes the others poll its lock with sleeps
that grow to 100 ms, so under contention the lock is often free while every waiter
sleeps. The engine's write transactions (:meth:`.db.SQLiteDatabase._write_transaction`)
first take their turn here: the threads of a process queue on a Python lock
(:class:`_WriterTurn`, the renewer first, none of the others passed over for long),
and the thread whose turn it is takes the turn between processes, a lock of a
file beside the database (:class:`_FileTurn`). Each writer then takes SQLite's
lock as the previous one commits. Other writers (the project's own code) still
meet them at SQLite's lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: processes meet at SQLite's lock alone
    fcntl = None  # type: ignore[assignment]

from .setup import BUSY_TIMEOUT_S, in_memory

__all__ = ["TURN_FILE_SUFFIX", "busy_timeout", "writer_turn"]

logger = logging.getLogger("selvedge_django.store")

# One lock per database file: the turns of this process's write transactions. A
# wait for the turn longer than this (s) shortens SQLite's busy timeout to what is left.
_TURN_WAIT_NOTICED = 0.5
# The file beside the database whose lock (flock) is the turn between processes.
TURN_FILE_SUFFIX = "-selvedge-turn"
# A writer first in a process's line for longer than this (s) takes the turn next:
# nobody passes it any more (:class:`_WriterTurn`).
_PATIENCE = 0.05
# A writer waiting for another process's turn looks again after this (s), doubling up to
# _TURN_POLL_MAX: the holder commits within a millisecond or two, where SQLite's busy
# handler would sleep 1, 2, 5, 10 ... 100 ms between looks.
_TURN_POLL_FIRST = 0.00005
_TURN_POLL_MAX = 0.0005


class _FileTurn:
    """The turn between processes: an exclusive ``flock`` of a file beside the database.

    Taken by the thread that holds this process's turn, so one thread per process
    waits for it. The kernel drops the lock of a process that dies, so a crash never
    leaves it taken. A process opens the file once (again after a fork: a child
    shares its parent's open file, and with it the lock). When the file cannot be
    opened (a read-only directory, no ``fcntl`` on this platform) the processes
    meet at SQLite's lock alone, as without it.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._pid = 0
        self._failed = False

    def _file(self) -> int | None:
        if fcntl is None or self._failed:
            return None
        if self._fd is None or self._pid != os.getpid():
            try:
                # Read-only: flock needs no write access, so processes of other users
                # (a web server's, a worker's) that can read the file share its lock.
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                self._failed = True
                logger.warning(
                    "cannot open %s (%s): processes sharing this SQLite database wait for "
                    "each other's writes with SQLite's busy handler",
                    self._path,
                    error,
                )
                return None
            self._pid = os.getpid()
        return self._fd

    def acquire(self, deadline: float) -> bool:
        """Take the lock, looking again with short sleeps until ``deadline`` (monotonic)."""
        fd = self._file()
        if fd is None:
            return False
        pause = _TURN_POLL_FIRST
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            except OSError:  # pragma: no cover - a file system without flock
                self._failed = True
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _TURN_POLL_MAX)

    def release(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            fcntl.flock(self._fd, fcntl.LOCK_UN)


class _WriterTurn:
    """A re-entrant lock whose urgent waiters go first and whose other waiters are
    never passed over for long.

    The renewals of leases and claims are urgent: a worker busy with its own writes
    must not let its leases and claims lapse while the renewer waits in line behind
    them. The others queue in the order they ask. While the first of them has waited
    less than :data:`_PATIENCE`, a free turn goes to whichever writer asks or wakes
    first, as with a plain lock: a thread that commits and writes again at once keeps
    going without a hand-over to another thread, which is most of a busy worker's
    throughput. Once it has waited longer, only it may take the turn next, so each
    writer's wait is bounded by the transactions of the writers before it, where a
    free-for-all could pass one over again and again for many seconds, longer than the
    lease it is taking can be trusted. The thread that takes the turn then takes the
    turn between processes (:class:`_FileTurn`), within what is left of the same
    timeout, and lets it go with the turn.
    """

    def __init__(self, file_turn: _FileTurn | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._tickets = itertools.count()
        # The waiters in the order they asked: (ticket, when they asked).
        self._urgent: deque[tuple[int, float]] = deque()
        self._others: deque[tuple[int, float]] = deque()
        self._file_turn = file_turn
        self._file_held = False  # read and written by the owner only

    @property
    def waiting(self) -> int:
        """How many threads wait for the turn."""
        with self._cond:
            return len(self._urgent) + len(self._others)

    def acquire(self, timeout: float, urgent: bool = False) -> bool:
        deadline = time.monotonic() + timeout
        if not self._acquire(timeout, urgent):
            return False
        if self._depth == 1 and self._file_turn is not None:
            self._file_held = self._file_turn.acquire(deadline)
        return True

    def _may_take(self, ticket: int | None, urgent: bool) -> bool:
        """Whether a writer (``ticket`` in line, None just asking) may take the turn now."""
        if self._owner is not None:
            return False
        if self._urgent:
            return urgent and self._urgent[0][0] == ticket
        if urgent or not self._others:
            return True
        first, since = self._others[0]
        return first == ticket or time.monotonic() - since < _PATIENCE

    def _acquire(self, timeout: float, urgent: bool) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if not self._may_take(None, urgent):
                ticket = next(self._tickets)
                entry = (ticket, time.monotonic())
                line = self._urgent if urgent else self._others
                line.append(entry)
                try:
                    taken = self._cond.wait_for(lambda: self._may_take(ticket, urgent), timeout)
                finally:
                    line.remove(entry)
                if not taken:
                    self._cond.notify_all()  # it may have been first in line: the next one goes
                    return False
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        if self._depth == 1 and self._file_held:
            self._file_held = False
            assert self._file_turn is not None
            self._file_turn.release()
        with self._cond:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()


_writer_locks: dict[str, _WriterTurn] = {}
_writer_locks_guard = threading.Lock()


@contextlib.contextmanager
def writer_turn(conn: Any, urgent: bool = False) -> Iterator[None]:
    """Wait for this process's turn, then the turn between processes, to write to
    ``conn``'s database file (the module's docstring says why). Re-entrant (a callback
    run at a commit may write again). An ``urgent`` writer (the renewer) is handed the turn
    before every other waiter of the process. The wait for the turn counts against
    the busy timeout: after a long one, SQLite waits only what is left of it (and
    then fails with "database is locked" as before); a writer whose turn does not
    come within the whole timeout goes on without it, as does one whose turn between
    processes (:class:`_FileTurn`, looked at again every half millisecond at most)
    does not come within what is left of it.
    """
    name = str(conn.settings_dict.get("NAME") or "")
    if in_memory(name):
        yield
        return
    with _writer_locks_guard:
        lock = _writer_locks.get(name)
        if lock is None:
            file_turn = None if name.startswith("file:") else _FileTurn(name + TURN_FILE_SUFFIX)
            lock = _writer_locks[name] = _WriterTurn(file_turn)
    timeout = busy_timeout(conn)
    began = time.monotonic()
    taken = lock.acquire(timeout, urgent)
    waited = time.monotonic() - began
    shortened = waited > _TURN_WAIT_NOTICED
    try:
        if shortened:
            left_ms = max(1, round((timeout - waited) * 1000))
            with conn.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {left_ms}")  # an int, never user text
        yield
    finally:
        try:
            if shortened:
                with contextlib.suppress(DatabaseError), conn.cursor() as cursor:
                    # A broken connection is dropped; a new one gets the timeout back.
                    cursor.execute(f"PRAGMA busy_timeout = {round(timeout * 1000)}")
        finally:
            if taken:
                lock.release()


def busy_timeout(conn: Any) -> float:
    """Seconds a writer of the engine's connections waits for SQLite's write lock."""
    options = conn.settings_dict.get("OPTIONS") or {}
    return float(options.get("timeout", BUSY_TIMEOUT_S))
