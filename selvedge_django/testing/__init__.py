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

The package never imports pytest, except its plugin module: ``clock.py`` (the
clock), ``helpers.py`` (running the loops, the mixin), ``faults.py`` (the fault
injector) and ``pytest_plugin.py`` (the fixtures).
"""

from __future__ import annotations

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
    "run_until_idle",
]
