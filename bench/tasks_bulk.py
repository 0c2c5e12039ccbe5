"""The task ``bench/bench_bulk.py`` enqueues (Django 6's django.tasks or the backport)."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def bulk_noop(i: int) -> int:
    return i + 1
