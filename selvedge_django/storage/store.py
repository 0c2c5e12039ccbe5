"""The portable store: every durable operation, one transaction each, on one database alias.

:class:`DjangoStore` puts the store's parts together (each a module of this
package, built on :class:`~.base.StoreBase`); what differs between databases is
in exactly one subclass each, :class:`~.postgresql.PostgresStore` and
:class:`~.sqlite.SQLiteStore`, and :func:`selvedge_django.storage.store_for`
picks it. Fenced writes start with a conditional update of the instance row
that must touch exactly one row (the writer still holds the lease epoch); claims
are fenced the same way by (owner, claim epoch) on the task row. Lease and claim
expiry use the database clock (``DbNowMs``). Wake-ups go out through the
in-process bus and, on PostgreSQL, NOTIFY, always after commit.
"""

from __future__ import annotations

from .execution_timeouts import ExecutionTimeoutStore
from .heartbeats import HeartbeatStore
from .inline import InlineResultStore
from .instances import InstanceHead, InstanceStore
from .locks import LockStore
from .reads import ReadStore
from .renewals import RenewalStore
from .resume import ResumeStoreMixin
from .status_reads import StatusReadStore
from .task_timeouts import TaskTimeoutStore
from .waits import WaitStore

__all__ = ["DjangoStore", "InstanceHead"]


class DjangoStore(
    InstanceStore,
    ResumeStoreMixin,
    ExecutionTimeoutStore,
    WaitStore,
    TaskTimeoutStore,
    RenewalStore,
    LockStore,
    HeartbeatStore,
    StatusReadStore,
    ReadStore,
    InlineResultStore,
):
    """Durable operations over the Django ORM for one database alias (portable part).

    Use :func:`selvedge_django.storage.store_for` to get the subclass of the alias's
    database; the portable class alone cannot dispatch or renew.
    """
