"""A backend for Django's ``django.tasks``: each enqueued task runs as one durable activity.

``TASKS = {"default": {"BACKEND": "selvedge_django.tasks.SelvedgeBackend"}}`` and
``manage.py runselvedge worker`` run the project's ``@task`` functions with durable
retries, deferral (``run_after``), priorities and results, and ``enqueue`` inside
``transaction.atomic()`` commits with the caller; :func:`enqueue_many` enqueues many
calls in one transaction, one statement per batch. See ``docs/tasks.md``.

Importing this package imports nothing of ``django.tasks``: :class:`SelvedgeBackend`
is loaded on first use (from Django 6's ``django.tasks``, or the ``django-tasks``
backport on Django 5.2), so the worker's built-in task workflow (``runner``) loads
on every Django line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import SelvedgeBackend, aenqueue_many, enqueue_many

__all__ = ["SelvedgeBackend", "aenqueue_many", "enqueue_many"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
