"""What a failed attempt and a lapsed claim leave on their task: the error envelopes.

An attempt records its own error (:func:`attempt_error_data`); a claim that lapsed
(its worker vanished, stalled or lost the database, or its attempt's deadline
passed) is given one by whoever notices (:func:`lapse_timeout`,
:func:`lapse_error_data`), naming the worker that held it and keeping the error
before it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .. import exceptions as exc
from ..engine.codec import Codec, error_to_envelope
from ..engine.events import error_data

if TYPE_CHECKING:
    from ..models import ActivityTask

__all__ = ["attempt_error_data", "lapse_error_data", "lapse_timeout", "lapsed_task_error"]

# The most JSON a lapse's error keeps of the task's error before it.
MAX_PREVIOUS_ERROR = 32_000


def lapse_timeout(
    name: str,
    attempt: int,
    deadline_ms: int | None,
    heartbeat_ms: int | None,
    expired_ms: int | None,
) -> exc.ActivityTimeoutError:
    """What a lapsed claim stands for: its attempt deadline, a missed heartbeat, or else
    only the lapse (the worker stopped renewing it: it vanished, stalled or lost the
    database), ``kind="claim_lapsed"``."""
    deadline_reached = deadline_ms is not None and (expired_ms is None or deadline_ms <= expired_ms)
    if deadline_reached:
        kind = "start_to_close"
    elif heartbeat_ms is not None:
        kind = "heartbeat"
    else:
        kind = "claim_lapsed"
    return exc.ActivityTimeoutError(name, kind, attempt)


def lapse_error_data(
    timeout: exc.ActivityTimeoutError, lost_owner: str, previous: str | None
) -> str:
    """The error a lapsed claim leaves on its task: the timeout, with the worker that held
    the claim (``fields.lost_worker_id``) and the task's error before the lapse
    (``fields.previous_error``), so that a lapse does not overwrite what the attempts
    before it recorded. The chain is cut when it would pass MAX_PREVIOUS_ERROR."""
    envelope = json.loads(error_data(timeout))
    envelope["fields"]["lost_worker_id"] = lost_owner
    try:
        prior = json.loads(previous) if previous else None
    except ValueError:
        prior = None
    if isinstance(prior, dict):
        if len(previous or "") > MAX_PREVIOUS_ERROR and isinstance(prior.get("fields"), dict):
            prior["fields"].pop("previous_error", None)  # keep the last error, not the chain
        if len(json.dumps(prior)) <= MAX_PREVIOUS_ERROR:
            envelope["fields"]["previous_error"] = prior
    return json.dumps(envelope)


def attempt_error_data(error: BaseException, worker_id: str, codec: Codec | None = None) -> str:
    """The error an attempt records for itself. An engine error (its deadline passed, a
    panic) carries no details of its own, so it names the worker whose attempt it was
    (``fields.lost_worker_id``, as a lapse does); an ApplicationError is left as it is."""
    envelope = error_to_envelope(error, codec=codec)
    if not isinstance(error, exc.ApplicationError):
        envelope.setdefault("fields", {})["lost_worker_id"] = worker_id
    return json.dumps(envelope)


def lapsed_task_error(task: ActivityTask, attempt: int) -> str:
    """The error of a lapsed claim (attempt ``attempt``) taken over by a new one."""
    timeout = lapse_timeout(
        task.name,
        attempt,
        task.attempt_deadline_ms,
        task.heartbeat_timeout_ms,
        task.claim_expires_ms,
    )
    return lapse_error_data(timeout, task.claim_owner, task.last_error)
