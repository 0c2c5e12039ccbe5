"""The admin console: read-only models, actions through the operations layer.

Nothing here edits a row by hand. Every write (cancel, terminate, signal, export,
and a schedule's add, change, delete, pause and trigger) calls the operations
layer, the same code path as the client API and ``runselvedge``, needs its own
permission besides view access, is a POST with CSRF protection, and is written to
the admin log. Recorded values are shown, and exported unredacted, only to users
with the ``view_payloads`` permission.

``display`` holds what the views show and validate, ``options`` the ModelAdmin
classes of instances, tasks and locks, ``schedules`` the Schedule admin.
Importing this package, as ``django.contrib.admin`` does on autodiscovery,
registers them.
"""

from . import options, schedules

__all__ = ["options", "schedules"]
