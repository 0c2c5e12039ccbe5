"""How the admin shows stored values: truncated, escaped, formatted for people.

Every stored value the admin shows goes through these helpers, so a huge input
or error never reaches a page whole, and a user without ``view_payloads`` sees
a value's size instead of the value.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from .. import exceptions as exc
from ..conf import get_settings
from ..engine.codec import Codec
from ..operations.base import read_alias
from ..storage import client_codec
from ..storage.admin_reads import AdminReads

# How much of a stored value is shown: a cell of a table, a value on the detail page.
CELL_CHARS = 200
VALUE_CHARS = 2000
ID_CHARS = 80
# The one rendering of an empty value, here and in the admin's own fields.
EMPTY = "-"
# The one rendering of a moment, in the current time zone and naming it (Django's date format).
TIME_FORMAT = "Y-m-d H:i:s T"
# A failed run's traceback: its last characters (the engine stores at most 8000).
TRACE_CHARS = 8000

_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")
# The start of a stored error envelope: {"type": "...", "message": "...", ...}.
_ENVELOPE_FIELD = re.compile(r'"(type|message)"\s*:\s*("(?:[^"\\]|\\.)*")')


# With a PAYLOAD_CODEC, how much of a stored value is read for a table cell: an
# envelope is opened whole or not at all (about 1.8 times the value's JSON).
ENCRYPTED_CUT = 16_384


def codec() -> Codec:
    """The codec of stored values, as configured (PAYLOAD_CONVERTER, PAYLOAD_CODEC)."""
    return client_codec(get_settings())


def payload_cut(cut: int) -> int:
    """How many characters of a stored value to read for a cell of ``cut``."""
    return max(cut, ENCRYPTED_CUT) if cut and get_settings().payload_reader else cut


def clear_text(text: str | None) -> str | None:
    """Stored JSON text as people read it: a payload codec's envelopes opened (a value's,
    an error envelope's sealed part).

    A value this server cannot decrypt (its key is not in PAYLOAD_KEYS), or one cut
    before its end, is shown as a note naming that.
    """
    if text is None or '"$codec"' not in text:
        return text
    try:
        stored = codec()
        value = stored.open_error(stored.decode(text))
    except exc.PayloadDecodeError as error:
        return gettext("(encrypted with key %(key)s, which this server does not have)") % {
            "key": error.key_id
        }
    except ValueError:
        return gettext("(encrypted value, too long to show here)")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def clear_value(value: Any) -> Any:
    """A stored JSON column's value as people read it (see :func:`clear_text`)."""
    try:
        return codec().open(value)
    except exc.PayloadDecodeError as error:
        return gettext("(encrypted with key %(key)s, which this server does not have)") % {
            "key": error.key_id
        }


def clear_error(text: str | None) -> str | None:
    """A stored error envelope with its sealed part opened, as JSON text."""
    if not text or '"sealed":' not in text:
        return text
    try:
        env = json.loads(text)
        return json.dumps(codec().open_error(env), ensure_ascii=False)
    except exc.PayloadDecodeError:
        return text
    except ValueError:
        return text


def truncate(text: str, limit: int) -> str:
    """Return ``text`` cut to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def json_preview(value: Any, limit: int = VALUE_CHARS) -> str:
    """Return a value as compact JSON text, truncated."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return truncate(text, limit)


def error_summary(text: str | None, limit: int = CELL_CHARS, *, values: bool = True) -> str:
    """Return ``type: message`` of a stored error envelope, truncated (without
    ``values``, for a user without ``view_payloads``, a message a payload codec
    encrypted is not decrypted: the type only)."""
    if not text:
        return ""
    if values:
        text = clear_error(text) or text
    try:
        env = json.loads(text)
    except ValueError:
        return truncate(text, limit)
    if not isinstance(env, dict):
        return truncate(text, limit)
    message = env.get("message") or ""
    return truncate(
        f"{env.get('type') or 'Error'}: {message}" if message else env.get("type") or "Error", limit
    )


def error_head_summary(head: str | None, limit: int = CELL_CHARS) -> str:
    """Return ``type: message`` from the first characters of a stored error envelope."""
    if not head:
        return ""
    try:
        return error_summary(head, limit) if json.loads(head) is not None else ""
    except ValueError:
        pass
    fields: dict[str, str] = {}
    for name, quoted in _ENVELOPE_FIELD.findall(head):
        try:
            fields.setdefault(name, json.loads(quoted))
        except ValueError:
            continue
    if not fields:
        return truncate(head, limit)
    return truncate(f"{fields.get('type') or 'Error'}: {fields.get('message') or ''}", limit)


def format_duration(seconds: float | None) -> str | None:
    """Return a duration for people: ``850 ms``, ``1.5 s``, ``3 min 4 s``, ``2 h 5 min``."""
    if seconds is None or seconds < 0:
        return None
    if seconds < 1:
        return gettext("%(n)d ms") % {"n": round(seconds * 1000)}
    if seconds < 60:
        return gettext("%(n).1f s") % {"n": seconds}
    whole = int(seconds)
    if whole < 3600:
        return gettext("%(m)d min %(s)d s") % {"m": whole // 60, "s": whole % 60}
    if whole < 86400:
        return gettext("%(h)d h %(m)d min") % {"h": whole // 3600, "m": whole % 3600 // 60}
    return gettext("%(d)d d %(h)d h") % {"d": whole // 86400, "h": whole % 86400 // 3600}


def safe_filename(instance_id: str) -> str:
    """Return a file name fragment built from an instance id (no path characters)."""
    return _UNSAFE_FILENAME.sub("_", instance_id).strip("._")[:80] or "instance"


def ms_datetime(ms: int | None) -> datetime | None:
    """Return Unix milliseconds (the database clock's ``*_ms`` columns) as a UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def database_alias() -> str:
    """Return the database alias the engine uses (``SELVEDGE["DATABASE"]``)."""
    return get_settings().database


def admin_reads() -> AdminReads:
    """Return the admin's bounded reads on the database this request reads: the read
    database, or the engine's when the page must see a write just made
    (:func:`selvedge_django.operations.base.read_alias`)."""
    return AdminReads(read_alias())


def hidden(size: int | None) -> str:
    """Return what a user without ``view_payloads`` sees instead of a value of ``size``."""
    return format_html(
        '<span class="selvedge-empty">{}</span>',
        gettext("(hidden: %(n)d characters; showing values needs the view_payloads permission)")
        % {"n": size or 0},
    )


def format_time(value: datetime | None) -> str:
    """Return a moment as the admin shows every one: ``2026-05-04 12:30:05 UTC``.

    In the current time zone (``TIME_ZONE``, or the one activated for the request),
    named after the time, so no reader has to guess which zone a page speaks in.
    """
    if value is None:
        return ""
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return dateformat.format(value, TIME_FORMAT)


def status_badge(status: str, label: Any = None) -> SafeString:
    """Return a status (an instance's or a task's) as a coloured badge."""
    return format_html(
        '<span class="selvedge-badge selvedge-badge-{}" data-status="{}">{}</span>',
        _UNSAFE_FILENAME.sub("-", status),
        status,
        label if label is not None else status,
    )


def error_html(text: str | None, limit: int = VALUE_CHARS) -> SafeString:
    """Return a stored error as readable text: type and message, details, traceback.

    The envelope's parts are shown as themselves, each escaped: the traceback with its
    real line breaks (pre-formatted), details and engine fields as indented JSON. Text
    that is not an envelope is shown pre-formatted as it is.
    """
    if not text:
        return SafeString("")
    text = clear_error(text) or text
    try:
        env = json.loads(text)
    except ValueError:
        env = None
    if not isinstance(env, dict):
        return format_html('<div class="selvedge-error"><pre>{}</pre></div>', truncate(text, limit))
    parts: list[tuple[str, str]] = []
    fields = env.get("fields")
    if isinstance(fields, dict):
        # The marker of an ApplicationError says nothing a reader needs.
        fields = {key: value for key, value in fields.items() if key != "application_error"}
    extra = {
        name: value
        for name, value in (("details", env.get("details")), ("fields", fields))
        if value not in (None, {})
    }
    if extra:
        shown = json.dumps(extra, indent=2, ensure_ascii=False, default=str)
        parts.append(("selvedge-error-details", truncate(shown, limit)))
    trace = env.get("traceback")
    if isinstance(trace, str) and trace.strip():
        cut = trace if len(trace) <= TRACE_CHARS else "\u2026" + trace[-TRACE_CHARS:]
        parts.append(("selvedge-error-traceback", cut.rstrip()))
    return format_html(
        '<div class="selvedge-error"><div class="selvedge-error-summary">{}</div>{}</div>',
        error_summary(text, limit),
        format_html_join("", '<pre class="{}">{}</pre>', parts),
    )
