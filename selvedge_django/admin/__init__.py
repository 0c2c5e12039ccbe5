"""The admin console: read-only models, actions through the operations layer.

Nothing here edits a row by hand. Every action (start, cancel, terminate, resume,
fork, signal, export, a query, a replay check, and a schedule's add, change,
delete, pause and trigger) calls the operations layer, the same code path as the
client API and ``runselvedge``, needs its own permission besides view access, is
a POST with CSRF protection, and is written to the admin log. Recorded values
are shown, and exported unredacted, only to users with the ``view_payloads``
permission.

The modules, bottom up: ``display`` (truncation and formatting of stored
values), ``base`` (permission names, the read-only base class), ``forms``,
``filters`` (the name, code version and error type filters, the cheap
changelist), ``sections`` (the bounded reads of an instance's page), ``actions``
(cancel, terminate, signal and export, as changelist actions and per-instance
views), ``recovery`` (resume and fork), ``console`` (the start page, an
instance's query and replay check), ``timeline`` (an instance's steps as SVG),
``dashboard`` (counts, failures, slowest steps, queues), ``options`` (the model admins of instances,
activity tasks and locks) and ``schedules`` (the Schedule admin).
Importing this package, as ``django.contrib.admin`` does on autodiscovery,
registers them; URLs and templates are those of the ``selvedge_django`` app.
"""

from . import options, schedules

__all__ = ["options", "schedules"]
