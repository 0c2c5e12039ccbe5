"""What a store is told after it is built: the settings and the worker's choices its parts read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["StoreOptions"]


def _no_names() -> Sequence[str] | None:
    return None


@dataclass
class StoreOptions:
    """One store's options, shared by reference with the parts that read them."""

    #: The workflow lease (seconds): the floor of an activity claim's TTL.
    lease_ttl: float = 30.0
    #: The activity names this store's worker runs (None: any), asked at each claim.
    activity_names: Callable[[], Sequence[str] | None] = _no_names
    #: The queues this store's worker claims from (None: every queue).
    activity_queues: tuple[str, ...] | None = None
    #: CODE_VERSION, recorded on the instances this store starts (children, schedule
    #: runs, forks; the client API passes its own).
    code_version: str | None = None
    #: COMPATIBLE_VERSIONS: the code versions whose instances this store leases.
    compatible_versions: tuple[str | None, ...] | None = None
    #: QUEUE_RATE_LIMITS: queue -> (claims, period in ms).
    queue_rate_limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: ACTIVITY_POLL_INTERVAL: how long a read of the paused queues is kept (seconds).
    paused_queues_max_age: float = 1.0
    #: Rate-limited queues known to be full, until when (local ms; a hint).
    queues_full_until: dict[str, float] = field(default_factory=dict)
    #: MAX_STREAM_ENTRIES: the most stream entries one instance holds.
    max_stream_entries: int = 100_000
