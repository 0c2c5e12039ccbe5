"""Testing helpers for projects that use selvedge_django.

* :class:`ControllableClock` drives ``ctx.now()``, timer expiry and the database
  clock seen by leases, claims and task deadlines together: ``advance()`` moves
  them all, so a workflow that sleeps a week is tested in milliseconds.
* :func:`run_until_idle` runs a worker's loops in the calling thread until
  nothing is runnable.
* :class:`SelvedgeTestMixin` gives a Django ``TransactionTestCase`` both, for
  ``manage.py test``; pytest users get the fixtures ``selvedge_clock`` and
  ``selvedge_worker`` from the plugin (:mod:`selvedge_django.testing.pytest_plugin`).
* :class:`FaultInjector` makes chosen database statements fail, or ends the
  process just before one or right after its transaction commits, to test
  what survives a crash at any step.
* :func:`replay_debug` replays a workflow's real code against its recorded
  history (an instance's, or an exported file's, without a database) and stops
  in the debugger just before a chosen command.

The package never imports pytest, except its plugin module: ``clock.py`` (the
clock), ``helpers.py`` (running the loops, the mixin), ``faults.py`` (the fault
injector) and ``pytest_plugin.py`` (the fixtures).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .clock import ControllableClock, installed_clock
from .faults import (
    FAULT_EXIT_STATUS,
    FAULTS_ENV,
    Fault,
    FaultInjector,
    InjectedFault,
    Statement,
    install_faults_from_env,
)
from .helpers import SelvedgeTestMixin, run_until_idle

if TYPE_CHECKING:
    from ..engine.debug import DebugReplay
    from ..engine.portable import RecordedHistory

__all__ = [
    "FAULTS_ENV",
    "FAULT_EXIT_STATUS",
    "ControllableClock",
    "Fault",
    "FaultInjector",
    "InjectedFault",
    "SelvedgeTestMixin",
    "Statement",
    "install_faults_from_env",
    "installed_clock",
    "replay_debug",
    "run_until_idle",
]


def replay_debug(
    history_or_instance_id: RecordedHistory | str | bytes | os.PathLike[str],
    *,
    stop_at: str | int | None = None,
) -> DebugReplay:
    """Replay a workflow in this process with its recorded values, stopping at ``stop_at``.

    ``history_or_instance_id`` is an instance id (its history is read, nothing is
    written), a :class:`~selvedge_django.RecordedHistory`, or an exported
    ``selvedge.history/v1`` file (a ``pathlib.Path``, or its JSON text), which needs
    no database. The registered workflow code runs read-only: recorded commands
    return their recorded values, no lease is taken, no row is written, no hook
    fires, and the replay ends at the first command the history does not record.
    With ``stop_at`` (a history key such as ``"#3:shop.charge_payment"``, or a
    command position) ``breakpoint()`` is called once, just before the workflow
    code issues that command: pdb, or your IDE through ``sys.breakpointhook``,
    stops there (``up`` to reach your code; the message printed says how far). A
    ``stop_at`` the history does not record raises
    :class:`~selvedge_django.HistoryKeyNotFound` before any code runs. See
    :func:`selvedge_django.operations.debugging.replay_debug`.
    """
    from ..operations.debugging import replay_debug as replay

    return replay(history_or_instance_id, stop_at=stop_at)
