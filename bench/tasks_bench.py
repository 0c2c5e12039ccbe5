"""The benchmark's task: the same trivial function under each backend."""

from __future__ import annotations

from django.tasks import task


def _work(i: int) -> int:
    return i + 1


@task(backend="selvedge")
def selvedge_noop(i: int) -> int:
    return _work(i)


@task(backend="db")
def db_noop(i: int) -> int:
    return _work(i)
