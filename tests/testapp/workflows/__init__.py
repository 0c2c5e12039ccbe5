"""Workflows and activities the test suite and its worker processes share, one module a topic.

Importing the package, as the app's autodiscovery does in every process, registers them
all. The registered names (``test.add``, ``cancel.wait``, ...) are what the tests start and
what the checked-in histories record: a move between modules keeps them.
"""

from . import (
    activities,
    basics,
    cancellation,
    children,
    continuation,
    disclosure,
    faults,
    flow,
    inline,
    limits,
    pauses,
    poison,
    recovery,
    sagas,
    scale,
    schedules,
    status,
    streams,
    terminate,
    waits,
    worker,
)

__all__ = [
    "activities",
    "basics",
    "cancellation",
    "children",
    "continuation",
    "disclosure",
    "faults",
    "flow",
    "inline",
    "limits",
    "pauses",
    "poison",
    "recovery",
    "sagas",
    "scale",
    "schedules",
    "status",
    "streams",
    "terminate",
    "waits",
    "worker",
]
