"""JSON values and error envelopes, as stored in history and instance rows.

Values are stored as compact JSON text. An absent value is SQL NULL, never the
text ``null``, so a recorded JSON null stays distinct from "no value yet".

Errors are stored as envelopes (a JSON object with ``kind``, ``type``,
``message``, ``details``, ``non_retryable``, ``traceback`` and per-kind
``fields``) and rebuilt into exceptions. A class named in stored data is never
imported: engine errors are rebuilt from a fixed table, everything else becomes
an :class:`~selvedge_django.exceptions.ApplicationError`.
"""

from __future__ import annotations

import json
import re
import traceback as tb
from datetime import UTC, datetime
from typing import Any

from .. import exceptions as exc

__all__ = ["Codec", "error_from_envelope", "error_to_envelope", "qualified_name"]


class Codec:
    """Encode and decode JSON values with a configurable encoder and size limit."""

    def __init__(
        self, encoder_cls: type[json.JSONEncoder] = json.JSONEncoder, max_bytes: int | None = None
    ) -> None:
        self.encoder_cls = encoder_cls
        self.max_bytes = max_bytes

    def encode(self, value: Any, what: str = "value") -> str:
        """Return compact JSON text, or raise TypeError/ValueError/PayloadTooLarge."""
        text = json.dumps(
            value, cls=self.encoder_cls, separators=(",", ":"), allow_nan=False, ensure_ascii=False
        )
        if self.max_bytes is not None and len(text.encode("utf-8")) > self.max_bytes:
            raise exc.PayloadTooLarge(
                f"{what} is {len(text.encode('utf-8'))} bytes encoded; "
                f"the limit (MAX_PAYLOAD_BYTES) is {self.max_bytes}"
            )
        return text

    @staticmethod
    def decode(text: str | None) -> Any:
        """Decode stored JSON text; None (absent) decodes to None."""
        if text is None:
            return None
        return json.loads(text)


# A JSON \u0000 escape (not an escaped backslash followed by "u0000").
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def parse_time(value: str) -> datetime:
    """An ISO 8601 datetime as an aware UTC datetime (naive values are taken as UTC)."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is UTC:
        return parsed
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def decode_time(data: str) -> datetime:
    """A recorded workflow time: the JSON string of an ISO 8601 datetime.

    Replay decodes one per ``ctx.now()`` of the history, so a string without
    escapes (every time this engine records) skips the JSON parser.
    """
    if len(data) > 1 and data[0] == '"' and data[-1] == '"' and "\\" not in data:
        return parse_time(data[1:-1])
    return parse_time(json.loads(data))


def contains_nul(text: str) -> bool:
    """Whether encoded JSON holds a NUL character, which PostgreSQL's jsonb cannot store."""
    return "\\u0000" in text and _ESCAPED_NUL.search(text) is not None


def qualified_name(cls: type) -> str:
    """Return ``module.QualName``, or the bare name for builtins."""
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


# Engine errors that are rebuilt as themselves. The key is the stored ``type``.
_ENGINE_ERRORS: dict[str, type[BaseException]] = {
    cls.__name__: cls
    for cls in (
        exc.ActivityTimeoutError,
        exc.RetryExhaustedError,
        exc.WorkflowCancelled,
        exc.ScopeCancelled,
        exc.Cancelled,
        exc.NondeterminismError,
        exc.WorkflowAlreadyStarted,
        exc.ReceiveTimeout,
        exc.WorkflowPanicError,
        exc.ReplayDecodeError,
        exc.WorkflowNotRegistered,
        exc.HistoryKeyConflict,
        exc.PayloadTooLarge,
        exc.ActivityCancelled,
    )
}


# Error messages and unencodable details are cut to this many characters, so that an
# error never stores more than MAX_PAYLOAD_BYTES allows a value (tracebacks: the last 8000).
MAX_ERROR_TEXT = 8000


def _bounded(text: str) -> str:
    if len(text) <= MAX_ERROR_TEXT:
        return text
    return f"{text[:MAX_ERROR_TEXT]}... [{len(text) - MAX_ERROR_TEXT} more characters cut]"


def _safe_details(details: Any, codec: Codec | None) -> Any:
    if details is None:
        return None
    try:
        text = (codec or Codec()).encode(details, "error details")
    except exc.PayloadTooLarge as error:
        return str(error)
    except (TypeError, ValueError):
        return _bounded(repr(details))
    return json.loads(text)


def error_to_envelope(
    error: BaseException, *, codec: Codec | None = None, with_traceback: bool = True
) -> dict[str, Any]:
    """Describe an exception as a JSON-safe envelope."""
    trace = ""
    if with_traceback and error.__traceback__ is not None:
        trace = "".join(tb.format_exception(type(error), error, error.__traceback__))[-8000:]
    message = error.message if isinstance(error, exc.SelvedgeError | exc.Cancelled) else str(error)
    message = _bounded(message)
    env: dict[str, Any] = {
        "kind": "application",
        "type": qualified_name(type(error)),
        "message": message,
        "details": None,
        "non_retryable": False,
        "traceback": trace,
        "fields": {},
    }
    if isinstance(error, exc.ApplicationError):
        env["type"] = error.type or "ApplicationError"
        env["details"] = _safe_details(error.details, codec)
        env["non_retryable"] = error.non_retryable
        env["fields"] = {"application_error": True}
        return env
    name = type(error).__name__
    if _ENGINE_ERRORS.get(name) is type(error):
        env["kind"] = "engine"
        env["type"] = name
        fields: dict[str, Any] = {}
        if isinstance(error, exc.ActivityTimeoutError):
            fields = {"activity": error.activity, "kind": error.kind, "attempt": error.attempt}
        elif isinstance(error, exc.RetryExhaustedError):
            last = error.last_error
            fields = {
                "activity": error.activity,
                "attempts": error.attempts,
                "last_error": error_to_envelope(last, codec=codec, with_traceback=False)
                if last is not None
                else None,
            }
        elif isinstance(error, exc.WorkflowCancelled):
            fields = {"instance_id": error.instance_id, "reason": error.reason}
        elif isinstance(error, exc.NondeterminismError):
            fields = {"key": error.key, "expected": error.expected, "actual": error.actual}
        elif isinstance(error, exc.WorkflowAlreadyStarted):
            fields = {"instance_id": error.instance_id}
        elif isinstance(error, exc.WorkflowNotRegistered):
            fields = {"workflow_name": error.workflow_name}
        env["fields"] = fields
    return env


def error_from_envelope(env: dict[str, Any]) -> BaseException:
    """Rebuild an exception from an envelope written by :func:`error_to_envelope`."""
    if not isinstance(env, dict):
        return exc.ApplicationError(str(env), type="UnknownError")
    kind = env.get("kind")
    etype = str(env.get("type") or "")
    message = str(env.get("message") or "")
    fields = env.get("fields") or {}
    error: BaseException
    if kind == "engine" and etype in _ENGINE_ERRORS:
        cls = _ENGINE_ERRORS[etype]
        if cls is exc.ActivityTimeoutError:
            error = exc.ActivityTimeoutError(
                fields.get("activity", ""), fields.get("kind", ""), int(fields.get("attempt", 0))
            )
        elif cls is exc.RetryExhaustedError:
            last = fields.get("last_error")
            error = exc.RetryExhaustedError(
                fields.get("activity", ""),
                int(fields.get("attempts", 0)),
                error_from_envelope(last) if last else None,
            )
        elif cls is exc.WorkflowCancelled:
            error = exc.WorkflowCancelled(fields.get("instance_id", ""), fields.get("reason", ""))
        elif cls is exc.NondeterminismError:
            error = exc.NondeterminismError(
                message,
                key=fields.get("key", ""),
                expected=fields.get("expected", ""),
                actual=fields.get("actual", ""),
            )
        elif cls is exc.WorkflowAlreadyStarted:
            error = exc.WorkflowAlreadyStarted(fields.get("instance_id", ""))
        elif cls is exc.WorkflowNotRegistered:
            error = exc.WorkflowNotRegistered(fields.get("workflow_name", ""))
        else:
            error = cls(message)
    else:
        error = exc.ApplicationError(
            message,
            type=etype or None,
            details=env.get("details"),
            non_retryable=bool(env.get("non_retryable")),
        )
    trace = env.get("traceback")
    if trace:
        error.remote_traceback = trace  # type: ignore[attr-defined]
    return error
