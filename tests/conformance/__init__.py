"""django-tasks-db's own test suite, run against SelvedgeBackend (``scripts/conformance``).

``test_django_tasks_db.py`` loads that suite from the library's source distribution
(the file ``DJANGO_TASKS_DB_TESTS`` names), points it at SelvedgeBackend and runs it
under ``tests.conformance.settings``. ``tasks.py`` is this app's tasks module: the
tasks the suite enqueues (its own task module is not in the distribution).
"""
