"""Handles from the client API: ``get_handle``, and the calls every handle makes.

:class:`~selvedge_django.handles.WorkflowHandle` sits with the definitions, below
this layer; :func:`install_client` hands it this layer's start, wait, describe,
signal, cancel and query (the app calls it when Django is ready).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, overload

from .. import handles
from ..engine.attributes import AttributeValue
from ..engine.durations import Duration
from ..handles import IfExists, WorkflowHandle
from ..registry import WorkflowDefinition
from .base import known_id
from .find import adescribe, describe
from .history import aquery, query
from .instances import (
    acancel_workflow,
    asignal,
    astart_workflow,
    cancel_workflow,
    signal,
    start_workflow,
)
from .results import await_workflow, wait_workflow

__all__ = [
    "get_handle",
    "install_client",
]

Out = TypeVar("Out")


@overload
def get_handle(instance_id: str, workflow: None = None) -> WorkflowHandle[Any]: ...


@overload
def get_handle(instance_id: str, workflow: WorkflowDefinition[Any, Out]) -> WorkflowHandle[Out]: ...


def get_handle(
    instance_id: str, workflow: WorkflowDefinition[Any, Any] | None = None
) -> WorkflowHandle[Any]:
    """Return a handle on an existing instance, typed by ``workflow`` when given.

    Nothing is read: an id no instance has raises :class:`WorkflowNotFound` at the
    handle's first call (an id no instance can have, here). ``workflow`` only types
    the handle (``result()`` returns its output type); it is not checked against
    the instance's workflow.
    """
    if workflow is not None and not isinstance(workflow, WorkflowDefinition):
        raise TypeError("workflow must be a workflow definition (the @workflow function)")
    return WorkflowHandle(known_id(instance_id))


class _Client:
    """This layer's calls, as a handle makes them (handles.HandleClient)."""

    def start_workflow(
        self,
        workflow_or_name: str,
        input: Any = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> str:
        return start_workflow(
            workflow_or_name,
            input,
            instance_id=instance_id,
            execution_timeout=execution_timeout,
            if_exists=if_exists,
            priority=priority,
            attributes=attributes,
        )

    async def astart_workflow(
        self,
        workflow_or_name: str,
        input: Any = None,
        *,
        instance_id: str | None = None,
        execution_timeout: Duration | None = None,
        if_exists: IfExists = "fail",
        priority: int = 0,
        attributes: Mapping[str, AttributeValue | None] | None = None,
    ) -> str:
        return await astart_workflow(
            workflow_or_name,
            input,
            instance_id=instance_id,
            execution_timeout=execution_timeout,
            if_exists=if_exists,
            priority=priority,
            attributes=attributes,
        )

    wait_workflow = staticmethod(wait_workflow)
    await_workflow = staticmethod(await_workflow)
    describe = staticmethod(describe)
    adescribe = staticmethod(adescribe)
    signal = staticmethod(signal)
    asignal = staticmethod(asignal)
    cancel_workflow = staticmethod(cancel_workflow)
    acancel_workflow = staticmethod(acancel_workflow)
    query = staticmethod(query)
    aquery = staticmethod(aquery)


def install_client() -> None:
    """Give every workflow handle this layer's client calls."""
    handles.install_client(_Client())
