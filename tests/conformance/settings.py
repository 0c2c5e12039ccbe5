"""Settings for django-tasks-db's test suite run against SelvedgeBackend.

The test suite's settings (without its test app) plus two apps: ``django_tasks_db``
(the suite imports its models and admin; its table exists and stays unused) and
``tests.conformance``, whose ``tasks`` module holds the tasks the suite enqueues
(workers find it as they find any app's tasks). The default backend has no OPTIONS,
as the suite expects.
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

# Without the suite's own test app: its tasks module defines tasks on queues that the
# suite's backends do not list, which Django refuses when the module is imported.
INSTALLED_APPS = [
    *(app for app in INSTALLED_APPS if app != "tests.testapp"),
    "django_tasks_db",
    "tests.conformance",
]
TASKS = {"default": {"BACKEND": "selvedge_django.tasks.SelvedgeBackend"}}
