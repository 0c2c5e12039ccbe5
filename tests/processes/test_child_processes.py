"""Children across processes: a child runs on the only worker process that registers it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django import registry
from tests.conftest import WorkerProcess
from tests.integration.test_children import rows
from tests.testapp.workflows import children as wf


@pytest.fixture
def only_remote_registers_child() -> Iterator[None]:
    """This process forgets ``child.remote`` and registers a parent that worker processes lack."""

    def local_parent(ctx: sv.WorkflowContext, value: Any) -> Any:
        return ctx.start_child("child.remote", value).get(ctx)

    registry.unregister("child.remote", kind="workflow")
    sv.workflow(name="child.local_parent")(local_parent)
    try:
        yield
    finally:
        registry.unregister("child.local_parent", kind="workflow")
        registry.register_workflow(wf.child_remote)


@pytest.mark.slow
def test_a_child_started_by_name_runs_on_the_only_worker_that_registers_it(
    only_remote_registers_child: None,
    make_worker: Callable[..., Any],
    worker_process: Callable[..., WorkerProcess],
) -> None:
    local = make_worker(worker_id="local-parent-runner")
    remote = worker_process("--worker-id", "remote-child-runner")
    try:
        parent = sv.start_workflow("child.local_parent", 7)
        result = sv.wait_workflow(parent, timeout=30)
        assert result.status == "completed", result.error
        assert result.output == {"value": 7, "worker": "remote-child-runner"}
        assert local.worker_id == "local-parent-runner"
        (child_row,) = rows(parent, "child")
        assert json.loads(child_row.reservation or "{}")["workflow"] == "child.remote"
        assert remote.terminate() == 0
    finally:
        if remote.proc.poll() is None:
            remote.kill()
        if remote.proc.stdout is not None:
            remote.proc.stdout.close()
