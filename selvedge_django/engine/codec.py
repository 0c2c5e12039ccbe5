"""JSON values and error envelopes, as stored in history and instance rows.

Values are stored as compact JSON text. An absent value is SQL NULL, never the
text ``null``, so a recorded JSON null stays distinct from "no value yet".

With a payload codec (``SELVEDGE["PAYLOAD_CODEC"]``), every user value passes
:meth:`Codec.encode` (JSON text, then the codec's bytes, then a JSON envelope
``{"$codec": <codec id>, "key": <key id>, "data": <base64>}``) and comes back
through :meth:`Codec.decode` / :meth:`Codec.open`, which read both envelopes and
plain JSON: each stored value says how it was encoded. This is the one seam every
stored user value passes through. An error envelope keeps its ``kind``, ``type``
and ``fields`` clear and seals its ``message``, ``details`` and ``traceback``
under ``sealed``.

Errors are stored as envelopes (a JSON object with ``kind``, ``type``,
``message``, ``details``, ``non_retryable``, ``traceback`` and per-kind
``fields``) and rebuilt into exceptions. A class named in stored data is never
imported: engine errors are rebuilt from a fixed table, everything else becomes
an :class:`~selvedge_django.exceptions.ApplicationError`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import traceback as tb
from datetime import UTC, datetime
from typing import Any

from .. import exceptions as exc

__all__ = [
    "ENVELOPE_CODEC",
    "MAX_NESTING_DEPTH",
    "Codec",
    "envelope_key",
    "envelope_type",
    "error_from_envelope",
    "error_to_envelope",
    "is_envelope",
    "nested_deeper_than",
    "qualified_name",
]

# Lists and objects nest at most this deep in any stored value. Python's JSON encoder
# and decoder recurse once per level, so a deeper value would fail with RecursionError
# wherever it is read (in workflow code, with its own frames on the stack, sooner).
MAX_NESTING_DEPTH = 100

# Every byte but quotes and brackets (JSON's structure outside strings is ASCII) goes;
# braces become brackets, so that one replace() below removes exactly one level.
_UNSTRUCTURAL = bytes(b for b in range(256) if b not in b'"[]{}')
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
_STRING = re.compile(rb'"[^"]*"')


def nested_deeper_than(text: str, limit: int = MAX_NESTING_DEPTH) -> bool:
    """Whether the JSON text nests lists and objects more than ``limit`` levels deep.

    Every step runs at C speed on the UTF-8: escaped backslashes and quotes are
    dropped, then every byte but quotes and brackets, then strings; each
    ``replace`` then removes every innermost ``[]`` pair, which is one level.
    """
    # Depth never exceeds the number of opening brackets: most values stop here.
    if text.count("[") + text.count("{") <= limit:
        return False
    raw = text.encode("utf-8")
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", raw.translate(_BRACKETS_ONLY, _UNSTRUCTURAL))
    for _ in range(limit):
        if not brackets:
            break
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


# The most bytes, encoded, of an activity's heartbeat details and of a workflow's
# progress: both are rewritten often (with claim renewals, at each set_progress()), so
# they stay small whatever MAX_PAYLOAD_BYTES allows other values.
MAX_PROGRESS_BYTES = 64 * 1024


# The key that marks a stored value as a payload codec's envelope.
ENVELOPE_CODEC = "$codec"
_ENVELOPE_KEYS = frozenset((ENVELOPE_CODEC, "key", "data"))
_ENVELOPE_PREFIX = '{"$codec":'


def is_envelope(value: Any) -> bool:
    """Whether a decoded JSON value is a payload codec's envelope."""
    return isinstance(value, dict) and len(value) == 3 and value.keys() == _ENVELOPE_KEYS


def envelope_key(text: str | None) -> tuple[str, str] | None:
    """The (codec id, key id) of stored JSON text that is an envelope, else None."""
    if not text or not text.startswith(_ENVELOPE_PREFIX):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not is_envelope(value):
        return None
    return str(value[ENVELOPE_CODEC]), str(value["key"])


def encode_progress(codec: Codec, value: Any, what: str) -> str:
    """Encode heartbeat details or a progress value: JSON, at most MAX_PROGRESS_BYTES.

    Raises what :meth:`Codec.encode` raises (TypeError or ValueError for a value
    that is not JSON, :class:`PayloadTooDeep`), and :class:`PayloadTooLarge` past
    the bound.
    """
    text = codec.encode_plain(value, what)
    size = len(text.encode("utf-8"))
    if size > MAX_PROGRESS_BYTES:
        raise exc.PayloadTooLarge(
            f"{what} is {size} bytes encoded; the limit is {MAX_PROGRESS_BYTES}"
        )
    return codec.seal(text)


class Codec:
    """Encode and decode JSON values with a configurable encoder and size limit.

    ``converter`` (the ``PAYLOAD_CONVERTER``; None: plain JSON) rebuilds decoded
    values by the annotations of the functions that receive them
    (:meth:`argument`, :meth:`result`); stored JSON is the same either way.
    ``payload`` (the ``PAYLOAD_CODEC``; None: values stored as plain JSON) turns
    the JSON into the bytes of an envelope (:meth:`seal`): the converter gives
    JSON, the codec bytes, the envelope JSON again.
    """

    def __init__(
        self,
        encoder_cls: type[json.JSONEncoder] = json.JSONEncoder,
        max_bytes: int | None = None,
        converter: Any = None,
        payload: Any = None,
        reader: Any = None,
    ) -> None:
        self.encoder_cls = encoder_cls
        self.max_bytes = max_bytes
        self.converter = converter
        self.payload = payload
        # What opens envelopes: the payload codec, or (a codec turned off with its keys
        # still configured) a codec that only reads what was stored before.
        self.reader = reader if reader is not None else payload

    # -- the payload codec ------------------------------------------------------------

    def seal(self, text: str) -> str:
        """Return stored JSON text for the JSON ``text``: an envelope with a payload codec."""
        codec = self.payload
        if codec is None:
            return text
        data = base64.b64encode(codec.encode(text.encode("utf-8"))).decode("ascii")
        return json.dumps(
            {ENVELOPE_CODEC: codec.codec_id, "key": codec.key_id, "data": data},
            separators=(",", ":"),
        )

    def open_text(self, envelope: dict[str, Any]) -> str:
        """The JSON text inside ``envelope``; :class:`PayloadDecodeError` when this
        process has not its codec or key (or the value is corrupt)."""
        codec_id, key_id = str(envelope[ENVELOPE_CODEC]), str(envelope["key"])
        codec = self.reader
        if codec is None or codec_id != codec.codec_id:
            raise exc.PayloadDecodeError(
                key_id,
                codec_id,
                f"cannot decode a stored value encoded by codec {codec_id!r} (key {key_id!r}):"
                " SELVEDGE['PAYLOAD_CODEC'] is "
                + ("not set" if codec is None else repr(codec.codec_id)),
            )
        key_ids = getattr(codec, "key_ids", None)
        if key_ids is not None and key_id not in key_ids:
            raise exc.PayloadDecodeError(key_id, codec_id)
        try:
            return str(codec.decode(base64.b64decode(str(envelope["data"]))).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, TypeError):
            raise exc.PayloadDecodeError(key_id, codec_id) from None
        except Exception as error:  # a codec's own error type (cryptography's InvalidToken)
            raise exc.PayloadDecodeError(key_id, codec_id) from error

    def open(self, value: Any) -> Any:
        """A decoded stored value as code sees it: an envelope opened, anything else as is."""
        if is_envelope(value):
            return json.loads(self.open_text(value))
        return value

    def reseal(self, text: str | None) -> str | None:
        """Stored text under the current codec and key, or None when it already is.

        Plain JSON is sealed (once a codec is configured), an envelope of another key
        is opened and sealed again; a value this process cannot open raises
        :class:`PayloadDecodeError`. Used by ``runselvedge rotate-keys``.
        """
        if text is None or self.payload is None:
            return None
        found = envelope_key(text)
        if found == (self.payload.codec_id, self.payload.key_id):
            return None
        if found is None:
            return self.seal(text)
        return self.seal(self.open_text(json.loads(text)))

    def reseal_value(self, value: Any) -> Any:
        """:meth:`reseal` for a value already decoded from JSON (a JSON column):
        the new envelope as a dict, or None when nothing changes."""
        if value is None or self.payload is None:
            return None
        if is_envelope(value):
            if (value[ENVELOPE_CODEC], value["key"]) == (
                self.payload.codec_id,
                self.payload.key_id,
            ):
                return None
            return json.loads(self.seal(self.open_text(value)))
        return json.loads(self.seal(json.dumps(value, separators=(",", ":"), ensure_ascii=False)))

    def open_error(self, env: Any) -> Any:
        """An error envelope with its sealed part opened (nested ones too)."""
        if not isinstance(env, dict):
            return env
        sealed = env.get("sealed")
        if isinstance(sealed, dict) and is_envelope(sealed):
            env = {k: v for k, v in env.items() if k != "sealed"}
            env.update(json.loads(self.open_text(sealed)))
        fields = env.get("fields")
        if isinstance(fields, dict) and any(isinstance(v, dict | list) for v in fields.values()):
            # Nested errors: last_error, previous_error, a CompensationError's errors.
            env = {**env, "fields": {name: self._open_nested(v) for name, v in fields.items()}}
        return env

    def _open_nested(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self.open_error(value)
        if isinstance(value, list):
            return [self.open_error(item) if isinstance(item, dict) else item for item in value]
        return value

    def seal_error(self, env: dict[str, Any]) -> dict[str, Any]:
        """Seal an error envelope's user text (message, details, traceback)."""
        if self.payload is None:
            return env
        private = {name: env.get(name) for name in ("message", "details", "traceback")}
        sealed = json.loads(self.seal(json.dumps(private, separators=(",", ":"))))
        return {**env, "message": "", "details": None, "traceback": "", "sealed": sealed}

    def argument(self, fn: Any, position: int, value: Any) -> Any:
        """A decoded value as parameter ``position`` of ``fn`` receives it."""
        if self.converter is None or fn is None:
            return value
        return self.converter.argument(fn, position, value)

    def result(self, fn: Any, value: Any) -> Any:
        """A decoded value as ``fn``'s result (its return annotation)."""
        if self.converter is None or fn is None:
            return value
        return self.converter.result(fn, value)

    def encode(self, value: Any, what: str = "value") -> str:
        """Return the stored JSON text of ``value`` (an envelope with a payload codec).

        Every stored user value passes here; it raises what :meth:`encode_plain` raises.
        """
        return self.seal(self.encode_plain(value, what))

    def encode_plain(self, value: Any, what: str = "value") -> str:
        """Return compact JSON text, or raise TypeError/ValueError/PayloadTooLarge/PayloadTooDeep.

        This is where the nesting cap (:data:`MAX_NESTING_DEPTH`) and the size cap
        (``max_bytes``, on the JSON before any payload codec) hold.
        """
        try:
            text = json.dumps(
                value,
                cls=self.encoder_cls,
                separators=(",", ":"),
                allow_nan=False,
                ensure_ascii=False,
            )
        except RecursionError:
            text = None  # raised below, outside the except block (no chained RecursionError)
        if text is not None and self.max_bytes is not None:
            size = len(text.encode("utf-8"))
            if size > self.max_bytes:
                raise exc.PayloadTooLarge(
                    f"{what} is {size} bytes encoded; "
                    f"the limit (MAX_PAYLOAD_BYTES) is {self.max_bytes}"
                )
        if text is None or nested_deeper_than(text):
            raise exc.PayloadTooDeep(
                f"{what} is nested more than {MAX_NESTING_DEPTH} levels deep "
                "(lists and objects inside each other)"
            )
        return text

    def decode(self, text: str | None) -> Any:
        """Decode stored JSON text (plain or an envelope); None (absent) decodes to None."""
        if text is None:
            return None
        if text.startswith(_ENVELOPE_PREFIX):
            return self.open(json.loads(text))
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
        exc.PayloadTooDeep,
        exc.ActivityCancelled,
        exc.HistoryLimitExceeded,
        exc.ExecutionStorageError,
        exc.WorkflowTerminated,
        exc.CompensationError,
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
        text = (codec or Codec()).encode_plain(details, "error details")
    except (exc.PayloadTooLarge, exc.PayloadTooDeep) as error:
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
        return env if codec is None else codec.seal_error(env)
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
        elif isinstance(error, exc.HistoryLimitExceeded):
            fields = {"instance_id": error.instance_id, "limit": error.limit, "value": error.value}
        elif isinstance(error, exc.ExecutionStorageError):
            fields = {
                "instance_id": error.instance_id,
                "errors": error.errors,
                "data_error": error.data_error,
            }
        elif isinstance(error, exc.WorkflowTerminated):
            fields = {"instance_id": error.instance_id, "reason": error.reason}
        elif isinstance(error, exc.CompensationError):
            fields = {
                "error": None
                if error.error is None
                else error_to_envelope(error.error, codec=codec, with_traceback=False),
                "compensation_errors": [
                    error_to_envelope(e, codec=codec, with_traceback=False)
                    for e in error.compensation_errors
                ],
            }
        env["fields"] = fields
    return env if codec is None else codec.seal_error(env)


def envelope_type(text: str | None, limit: int = 255) -> str:
    """Return the ``type`` of a stored error envelope (at most ``limit`` characters).

    An empty string when ``text`` is not an envelope (None, not JSON, not an object).
    """
    try:
        env = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return ""
    if not isinstance(env, dict):
        return ""
    return str(env.get("type") or "")[:limit]


def error_from_envelope(env: dict[str, Any], codec: Codec | None = None) -> BaseException:
    """Rebuild an exception from an envelope written by :func:`error_to_envelope`.

    An envelope that this engine cannot have written (wrong types, a field of the
    wrong shape) raises :class:`ReplayDecodeError`: stored data is corrupt, and
    that must not surface as an ``AttributeError`` inside workflow code. A sealed
    envelope is opened with ``codec`` (:class:`PayloadDecodeError` when it cannot).
    """
    if codec is not None:
        env = codec.open_error(env)
    if not isinstance(env, dict):
        return exc.ApplicationError(str(env), type="UnknownError")
    try:
        return _rebuild(env)
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError) as error:
        raise exc.ReplayDecodeError(
            f"corrupt error envelope ({type(error).__name__}: {error})"[:500]
        ) from None


def _text_field(env: dict[str, Any], name: str) -> str:
    value = env.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be text, not {type(value).__name__}")
    return value


def _rebuild(env: dict[str, Any]) -> BaseException:
    kind = env.get("kind")
    etype = _text_field(env, "type")
    message = _text_field(env, "message")
    fields = env.get("fields") or {}
    if not isinstance(fields, dict):
        raise TypeError(f"fields must be an object, not {type(fields).__name__}")
    error: BaseException
    if kind == "engine" and etype in _ENGINE_ERRORS:
        cls = _ENGINE_ERRORS[etype]
        if cls is exc.ActivityTimeoutError:
            error = exc.ActivityTimeoutError(
                fields.get("activity", ""), fields.get("kind", ""), int(fields.get("attempt", 0))
            )
        elif cls is exc.RetryExhaustedError:
            last = fields.get("last_error")
            if last and not isinstance(last, dict):
                raise TypeError(f"last_error must be an object, not {type(last).__name__}")
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
        elif cls is exc.ExecutionStorageError:
            error = exc.ExecutionStorageError(
                str(fields.get("instance_id", "")),
                int(fields.get("errors", 0)),
                bool(fields.get("data_error", False)),
                message or None,
            )
        elif cls is exc.WorkflowTerminated:
            error = exc.WorkflowTerminated(
                str(fields.get("instance_id", "")), str(fields.get("reason", ""))
            )
        elif cls is exc.CompensationError:
            cause = fields.get("error")
            failures = fields.get("compensation_errors") or []
            if (cause is not None and not isinstance(cause, dict)) or not isinstance(
                failures, list
            ):
                raise TypeError("a compensation error's fields have the wrong shape")
            error = exc.CompensationError(
                None if cause is None else error_from_envelope(cause),
                [error_from_envelope(failure) for failure in failures],
            )
        elif cls is exc.HistoryLimitExceeded:
            error = exc.HistoryLimitExceeded(
                str(fields.get("instance_id", "")),
                str(fields.get("limit", "")),
                int(fields.get("value", 0)),
                message or None,
            )
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
