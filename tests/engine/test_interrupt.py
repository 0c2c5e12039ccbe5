"""The deadline guard of query handlers: a trace function that interrupts Python code."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from selvedge_django.engine.interrupt import Deadline, DeadlinePassed


def spin() -> None:
    while True:
        pass


@pytest.mark.timeout(30)
def test_a_loop_is_interrupted_at_the_deadline_and_the_tracer_is_restored() -> None:
    calls: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        calls.append(frame.f_code.co_name)
        return None

    sys.settrace(tracer)
    try:
        started = time.monotonic()
        with pytest.raises(DeadlinePassed), Deadline(started + 0.2) as guard:
            spin()
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert 0.2 <= time.monotonic() - started < 10
    assert guard.fired and "spin" in calls


def test_code_that_returns_in_time_is_untouched() -> None:
    with Deadline(time.monotonic() + 60) as guard:
        assert sum(n for n in range(1000)) == 499500
    assert not guard.fired and sys.gettrace() is None


def test_a_generator_that_outlives_the_guard_is_not_interrupted_later() -> None:
    def numbers() -> Iterator[int]:
        n = 0
        while True:
            yield n
            n += 1

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return tracer

    # Made and started under the guard, resumed after it, past its deadline, with another
    # tracer on: the guard is gone from the frame, nothing interrupts it.
    sys.settrace(tracer)
    try:
        with Deadline(time.monotonic() + 0.05) as guard:
            made = numbers()
            assert next(made) == 0
        time.sleep(0.1)
        assert [next(made) for _ in range(3)] == [1, 2, 3]
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert not guard.fired
