"""The admin console: read-only models, actions through the operations layer.

Nothing here edits a row by hand. Every action (start, cancel, terminate, resume,
fork, signal, export, a query, a replay check, and a schedule's add, change,
delete, pause and trigger) calls the operations layer, the same code path as the
client API and ``runselvedge``, needs its own permission besides view access, is
a POST with CSRF protection, and is written to the admin log. Recorded values
are shown, and exported unredacted, only to users with the ``view_payloads``
permission.

One model admin per model, each in its own module: ``instances``
(:class:`~.instances.WorkflowInstanceAdmin`), ``tasks`` (activity tasks),
``locks`` (system locks) and ``schedules``. A model admin wires what the other
modules define as module-level functions taking it first: the actions (``@admin.action``
functions) and views of ``actions`` (cancel, terminate, signal, export) and
``recovery`` (resume, fork), the views of ``console`` (the start page, an
instance's query and replay check) and ``dashboard`` (counts, failures, slowest
steps, queues). Below them: ``pages`` (an action's form page, a selection's
confirmation, a download), ``sections`` (what an instance's page shows below its
description) and ``timeline`` (its steps as SVG), ``filters`` (the name, code
version and error type filters, the cheap changelist), ``forms``, ``base``
(permissions, the read-only base class) and ``display`` (truncation and
formatting of stored values). Every read beyond the changelist's own query set is
one of :class:`~selvedge_django.storage.admin_reads.AdminReads`.
Importing this package, as ``django.contrib.admin`` does on autodiscovery,
registers the model admins; URLs and templates are those of the ``selvedge_django`` app.
"""

from . import instances, locks, schedules, tasks

__all__ = ["instances", "locks", "schedules", "tasks"]
