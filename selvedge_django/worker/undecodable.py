"""Instances this worker cannot decode: left for a worker that has the key.

An execution that meets a stored value encrypted under a key (or codec) this
worker does not have (:class:`~selvedge_django.exceptions.PayloadDecodeError`)
is abandoned without a write; its lease is released with the instance still
runnable, so a worker with the key takes it. This worker then passes the
instance over for a while (:data:`FIRST_DELAY`, doubling up to :data:`MAX_DELAY`
after each try that fails the same way), says so once per instance in the log,
and lists it in its heartbeat row, which ``runselvedge status`` shows.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .. import exceptions as exc

__all__ = ["FIRST_DELAY", "MAX_DELAY", "MAX_PASSED_OVER", "MAX_REPORTED", "Undecodable"]

logger = logging.getLogger("selvedge_django.worker")

# Seconds an instance is passed over after the first failed decode, and at most.
FIRST_DELAY = 30.0
MAX_DELAY = 900.0
# At most this many instances are remembered (the oldest are forgotten first), and
# listed in the heartbeat row.
MAX_REMEMBERED = 10_000
MAX_REPORTED = 50
# At most this many are named in a dispatch statement (NOT IN): the latest met.
MAX_PASSED_OVER = 500


class Undecodable:
    """The instances one worker passes over because it cannot decode them."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        # instance id -> (monotonic time it may be tried again, delay, key id)
        self._entries: dict[str, tuple[float, float, str]] = {}

    def met(self, instance_id: str, error: exc.PayloadDecodeError) -> float:
        """Record a failed decode of ``instance_id``; return how long it is passed over."""
        with self._lock:
            previous = self._entries.pop(instance_id, None)
            delay = FIRST_DELAY if previous is None else min(previous[1] * 2, MAX_DELAY)
            self._entries[instance_id] = (time.monotonic() + delay, delay, error.key_id)
            while len(self._entries) > MAX_REMEMBERED:
                self._entries.pop(next(iter(self._entries)))
        if previous is None:
            logger.warning(
                "worker %s cannot decode a stored value of workflow instance %s (codec %r, key"
                " %r): the instance is left running and unchanged for a worker that has the"
                " key; this worker passes it over for %.0f s",
                self.worker_id,
                instance_id,
                error.codec_id,
                error.key_id,
                delay,
                extra={"instance_id": instance_id, "key_id": error.key_id},
            )
        return delay

    def decoded(self, instance_id: str) -> None:
        """``instance_id`` ran here without a decode failure: forget it."""
        if self._entries:
            with self._lock:
                self._entries.pop(instance_id, None)

    def passed_over(self) -> list[str]:
        """The instances this worker does not lease now (the latest MAX_PASSED_OVER met)."""
        if not self._entries:
            return []
        now = time.monotonic()
        with self._lock:
            waiting = [iid for iid, (until, _, _) in self._entries.items() if until > now]
        return waiting[-MAX_PASSED_OVER:]

    def report(self) -> list[dict[str, Any]]:
        """What the heartbeat row lists: the latest instances met, with their key ids."""
        with self._lock:
            items = list(self._entries.items())[-MAX_REPORTED:]
        return [{"instance_id": iid, "key_id": key_id} for iid, (_, _, key_id) in items]
