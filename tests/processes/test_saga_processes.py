"""A saga's compensations across a worker process killed in the middle of them.

The compensations are activities recorded in history: the worker that takes over
replays the saga, gets the recorded outcome of each compensation already done, and
runs only the rest. The ledger (``tests/testapp/workflows/sagas.py``) counts every
attempt of every compensation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import selvedge_django as sv
from selvedge_django.models import ActivityTask
from tests.conftest import WorkerProcess, wait_until
from tests.testapp.models import Ledger


def ledger() -> list[str]:
    return list(Ledger.objects.order_by("id").values_list("entry", flat=True))


def test_a_worker_killed_mid_compensation_is_replaced_and_done_ones_do_not_run_again(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    marker = tmp_path / "hold"
    marker.touch()
    first = worker_process("--worker-id", "saga-a")
    instance_id = sv.start_workflow(
        "saga.run",
        {
            "steps": ["a", "b", "c"],
            "fail": True,
            "undo": {"b": {"hold_while": str(marker), "hold_on": [1]}},
        },
        instance_id="saga-killed",
    )
    # c is undone, b's first attempt holds: the worker dies in the middle of the saga.
    wait_until(lambda: "undo:b:1" in ledger(), timeout=40)
    assert "undone:c" in ledger()
    first.kill()  # SIGKILL: no cleanup at all

    second = worker_process("--worker-id", "saga-b")
    result = sv.wait_workflow(instance_id, timeout=60)

    assert result.status == "failed", result.error
    assert result.error.type == "OrderFailed"
    entries = ledger()
    # Each compensation that finished ran once; b's killed attempt ran again (activities
    # are at least once), then a, and nothing twice that had been recorded.
    assert entries == [
        "do:a",
        "do:b",
        "do:c",
        "undo:c:1",
        "undone:c",
        "undo:b:1",
        "undo:b:2",
        "undone:b",
        "undo:a:1",
        "undone:a",
    ]
    owners = dict(
        ActivityTask.objects.filter(instance_id=instance_id, name="saga.undo").values_list(
            "key", "claim_owner"
        )
    )
    assert owners == {"#4:saga.undo": "saga-a", "#5:saga.undo": "saga-b", "#6:saga.undo": "saga-b"}
    sv.replay_instance(instance_id)
    assert second.terminate() == 0
