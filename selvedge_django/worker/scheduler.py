"""The leader's schedule duty: start the runs of due slots, one batch per call.

The leader loop calls :meth:`ScheduleDuty.run_once` while it holds the leader
lock; every worker calls :meth:`ScheduleDuty.sync` when it starts, to create or
update the schedules of ``SELVEDGE["SCHEDULES"]``. Each batch is one
transaction (see :mod:`selvedge_django.storage.schedules`); the start hooks fire
after it commits.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from .. import exceptions as exc
from ..hooks import schedule_trace

if TYPE_CHECKING:
    from .runtime import WorkerRuntime

__all__ = ["ScheduleDuty"]

logger = logging.getLogger("selvedge_django.worker")


class ScheduleDuty:
    """Fire due schedules for one worker's runtime (called by its leader loop)."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.schedules = runtime.store.schedules
        self.synced = False

    def sync(self) -> None:
        """Create or update the code-defined schedules (once per worker).

        An invalid definition raises ImproperlyConfigured (the system check
        ``selvedge.E004`` reports it earlier); a database error is logged and the
        sync tried again by the next :meth:`run_once`.
        """
        from ..schedules import sync_code_schedules

        try:
            written = sync_code_schedules(self.runtime.settings, store=self.schedules)
        except exc.InvalidSchedule as error:
            raise ImproperlyConfigured(str(error)) from error
        except DatabaseError:
            logger.warning("could not sync SELVEDGE['SCHEDULES']; trying again", exc_info=True)
            self.runtime.drop_broken_connection()
            return
        self.synced = True
        if written:
            logger.info("schedules created or updated from the settings: %s", ", ".join(written))

    def run_once(self) -> int:
        """Handle one batch of due schedules; return how many changed."""
        if not self.synced:
            self.sync()
        runtime = self.runtime
        hooks = runtime.settings.hooks
        result = self.schedules.fire_due(
            runtime.settings.max_workflows_per_batch,
            None if hooks is None else schedule_trace(hooks),
        )
        for run_id, workflow_name in result.started:
            runtime.fire("on_workflow_started", instance_id=run_id, workflow_name=workflow_name)
        return result.schedules
