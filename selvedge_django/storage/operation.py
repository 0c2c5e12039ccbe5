"""Store operations, marked: the names the fault injector gives the statements.

:func:`operation` marks a public method of the store (or of one of its parts, or of
the database under it) as a store operation;
:class:`~selvedge_django.testing.FaultInjector` names each statement after the
outermost marked method on the stack.
"""

from __future__ import annotations

from collections.abc import Callable
from types import CodeType
from typing import Any, TypeVar

__all__ = ["OPERATIONS", "operation"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: The code object of every store operation (see :func:`operation`) and its name.
OPERATIONS: dict[CodeType, str] = {}


def operation(method: _F) -> _F:
    """Mark a public store method as a store operation; returns it unchanged.

    Nothing runs at call time: the mark is the method's code object in
    :data:`OPERATIONS`, which is how
    :class:`~selvedge_django.testing.FaultInjector` names each statement after
    the outermost operation on the stack (``operation="complete_task"``). A
    generator-based context manager is marked by its generator's code.
    """
    target = getattr(method, "__wrapped__", method)
    OPERATIONS[target.__code__] = method.__name__
    return method
