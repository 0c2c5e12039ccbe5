"""Streams across real worker processes: a reader here, a writer there, and a SIGKILL.

The activity of ``test.streams.crashy`` writes its entries live from a worker process;
this process reads them while the attempt still runs (woken through NOTIFY on
PostgreSQL, by polling on SQLite). Killed mid-attempt, the worker loses no committed
entry, and the retry's entries follow them, tagged with the next attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from pathlib import Path

import selvedge_django as sv
from tests.conftest import WorkerProcess, wait_until


def test_a_killed_worker_loses_no_committed_entry_and_the_retry_follows(
    worker_process: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    wrote = tmp_path / "wrote"
    first = worker_process("--worker-id", "streams-a")
    iid = sv.start_workflow("test.streams.crashy", {"n": 3, "wrote": str(wrote)})
    reader = sv.read_stream(iid, "out", timeout=60)
    live = [(e.seq, e.attempt) for e in islice(reader, 3)]
    assert live == [(1, 1), (2, 1), (3, 1)]  # read while the attempt runs in the other process
    wait_until(wrote.exists)
    first.kill()  # SIGKILL between the attempt's writes and its outcome
    kept = islice(sv.read_stream(iid, "out", timeout=5), 3)
    assert [(e.seq, e.attempt) for e in kept] == [(1, 1), (2, 1), (3, 1)]

    second = worker_process("--worker-id", "streams-b")
    assert sv.wait_workflow(iid, timeout=60).output == 3
    entries = list(sv.read_stream(iid, "out", timeout=5))  # the instance closed: it ends
    assert [(e.seq, e.attempt, e.value["i"]) for e in entries] == [
        (1, 1, 0),
        (2, 1, 1),
        (3, 1, 2),
        (4, 2, 0),
        (5, 2, 1),
        (6, 2, 2),
    ]
    assert second.terminate() == 0
