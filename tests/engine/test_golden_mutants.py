"""The mutation test of the replay check: every changed workflow is reported.

Each golden history of ``ops.golden.order`` (``tests/histories/``) is replayed
against each mutated version of that workflow in ``tests/engine/golden_mutants.py``;
``replay_history`` must report every pair as a ``NondeterminismError``. No
database is needed: replay never touches storage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import selvedge_django as sv

from . import golden_mutants

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
GOLDEN = [
    "order_completed.json",
    "order_completed_reformatted.json",
    "order_running.json",
    "order_failed.json",
    "order_cancelled.json",
]


@pytest.mark.parametrize("name", GOLDEN)
def test_the_unchanged_workflow_replays_every_golden_history(name: str) -> None:
    sv.replay_history(sv.parse_history((HISTORIES / name).read_bytes()))


@pytest.mark.parametrize("variant", golden_mutants.VARIANTS, ids=lambda v: v.__name__)
@pytest.mark.parametrize("name", GOLDEN)
def test_every_mutated_workflow_is_reported(
    redefine: Callable[[str, Callable[..., Any]], None],
    name: str,
    variant: Callable[..., Any],
) -> None:
    history = sv.parse_history((HISTORIES / name).read_bytes())
    redefine("ops.golden.order", variant)
    with pytest.raises(sv.ReplayError) as caught:
        sv.replay_history(history)
    assert caught.value.instance_id == history.instance.instance_id
    assert isinstance(caught.value.divergence, sv.NondeterminismError), caught.value.divergence
