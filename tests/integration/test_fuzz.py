"""Bad input, fuzzed: a typed error for every entry point, never a crash or a partial write.

Each target runs 500 generated examples (hypothesis). Targets that write only
touch the database once their input passed validation; rejected input is
refused before any statement runs (checked with a statement counter).
"""

from __future__ import annotations

import base64
import copy
import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import selvedge_django as sv
from selvedge_django.engine.portable import ABSENT
from selvedge_django.models import SignalMessage, WorkflowInstance
from selvedge_django.testing import FaultInjector

FUZZ = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text as it arrives from the outside: any code point, surrogates, NUL and other
# control characters included.
any_char = st.characters(codec=None, categories=None)
any_text = st.text(any_char, max_size=300)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=25,
)
# Values that are not JSON at all.
python_values = json_values | st.sets(st.integers(), max_size=3) | st.binary(max_size=20)
python_values = st.recursive(
    python_values,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.integers() | st.none() | any_text, inner, max_size=4)
    ),
    max_leaves=15,
)


def encodable(value: Any) -> bool:
    """Whether the codec accepts the value (strict JSON, UTF-8, no NUL in text)."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError):
        return False
    return True


# -- parse_history ------------------------------------------------------------------------

VALID_HISTORY: dict[str, Any] = {
    "format": "selvedge.history/v1",
    "instance": {
        "instance_id": "fuzz",
        "workflow_name": "fault.child",
        "status": "completed",
        "input": {"tag": "t"},
        "output": "child:t",
        "cancel_requested": False,
        "cancel_reason": "",
        "parent_instance_id": "",
        "parent_key": "",
    },
    "events": [
        {
            "seq": 1,
            "key": "#1:fault.step",
            "command": "activity",
            "event_type": "ActivityCompleted",
            "data": "t",
            "data_type": "json",
            "binary": None,
            "reservation": {"name": "fault.step", "queue": ""},
            "delivered_seq": 0,
        },
        {
            "seq": 0,
            "key": "$close",
            "command": "close",
            "event_type": "WorkflowCompleted",
            "data": "child:t",
            "data_type": "json",
            "binary": None,
            "delivered_seq": 0,
        },
    ],
    "signals": [{"id": 1, "channel": "go", "delivered_seq": 0, "consumed_seq": 0}],
}


def parse_or_typed_error(data: str | bytes) -> sv.RecordedHistory | None:
    try:
        return sv.parse_history(data)
    except sv.UnsupportedHistoryFormat:
        return None


@FUZZ
@given(st.binary(max_size=2000))
def test_parse_history_of_arbitrary_bytes(data: bytes) -> None:
    parsed = parse_or_typed_error(data)
    if parsed is not None:
        assert sv.parse_history(parsed.to_json()).to_dict() == parsed.to_dict()


@FUZZ
@given(json_values | st.dictionaries(st.sampled_from(sorted(VALID_HISTORY)), json_values))
def test_parse_history_of_arbitrary_json(doc: Any) -> None:
    try:
        text = json.dumps(doc, ensure_ascii=False)
    except ValueError:
        return
    for data in (text, text.encode("utf-8", "surrogatepass")):
        parsed = parse_or_typed_error(data)
        if parsed is not None:
            assert sv.parse_history(parsed.to_json()).to_dict() == parsed.to_dict()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@st.composite
def mutated_histories(draw: st.DrawFn) -> dict[str, Any]:
    """A valid history with a few fields replaced, removed or added."""
    doc = copy.deepcopy(VALID_HISTORY)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(any_text)] = draw(json_values)
        else:
            parent.append(draw(json_values))
    return doc


@pytest.mark.django_db
@FUZZ
@given(mutated_histories())
def test_parse_and_replay_of_mutated_histories(doc: dict[str, Any]) -> None:
    try:
        text = json.dumps(doc, ensure_ascii=False)
    except ValueError:
        return
    parsed = parse_or_typed_error(text)
    if parsed is None:
        return
    assert sv.parse_history(parsed.to_json()).to_dict() == parsed.to_dict()
    # A history that parses replays, or fails with a typed error: never a crash.
    try:
        sv.replay_history(parsed)
    except (sv.ReplayError, sv.WorkflowNotRegistered):
        pass


def test_the_valid_history_replays() -> None:
    history = sv.parse_history(json.dumps(VALID_HISTORY))
    assert history.instance.input == {"tag": "t"} and history.events[1].reservation is ABSENT
    sv.replay_history(history)


# -- signals -----------------------------------------------------------------------------


@pytest.fixture
def running(db: None) -> str:
    """A running instance (no worker: it stays running)."""
    return sv.start_workflow("fault.flow", {"tag": "fuzz"}, instance_id="fuzz-target")


channels = any_text | st.text(any_char, min_size=250, max_size=300) | st.integers() | st.none()


@FUZZ
@given(channel=channels, payload=python_values)
def test_signal_channels_and_payloads(running: str, channel: Any, payload: Any) -> None:
    before = SignalMessage.objects.count()
    with CaptureQueriesContext(connection) as queries:
        try:
            sv.signal(running, channel, payload)
        except (sv.InvalidSignalChannel, sv.InvalidSignalPayload, sv.PayloadTooLarge):
            accepted = False
        else:
            accepted = True
    if not accepted:
        assert len(queries) == 0, "rejected input must not reach the database"
        assert SignalMessage.objects.count() == before
        return
    assert isinstance(channel, str) and 1 <= len(channel.encode("utf-8")) <= 255
    assert "\x00" not in channel
    latest = SignalMessage.objects.order_by("-id").first()
    assert latest is not None and SignalMessage.objects.count() == before + 1
    assert (latest.channel, json.loads(latest.payload)) == (channel, _roundtrip(payload))


def _roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def same_json(stored: Any, given: Any) -> bool:
    """Equal as JSON values. PostgreSQL's jsonb keeps a number's decimal value, not Python's
    float or int: 4.2e16 comes back as the integer 42000000000000000."""
    if isinstance(given, float) and type(stored) in (int, float):
        return math.isclose(float(stored), given, rel_tol=1e-15)
    if isinstance(given, list) and isinstance(stored, list) and len(given) == len(stored):
        return all(same_json(s, g) for s, g in zip(stored, given, strict=True))
    if isinstance(given, dict) and isinstance(stored, dict) and stored.keys() == given.keys():
        return all(same_json(stored[k], given[k]) for k in given)
    return bool(stored == given and type(stored) is type(given))


@FUZZ
@given(instance_id=any_text | st.integers() | st.none(), channel=st.sampled_from(["go", "x"]))
def test_signals_to_unknown_instances(db: None, instance_id: Any, channel: str) -> None:
    with pytest.raises(sv.WorkflowNotFound):
        sv.signal(instance_id, channel, 1)
    assert not SignalMessage.objects.exists()


# -- starting workflows --------------------------------------------------------------------

instance_ids = (
    st.none()
    | any_text
    | st.text(any_char, min_size=250, max_size=300)
    | st.integers()
    | st.binary(max_size=10)
)
workflow_names = st.sampled_from(["fault.flow", "not.registered"]) | any_text | st.none()


@FUZZ
@given(name=workflow_names, value=python_values, instance_id=instance_ids)
def test_workflow_inputs_ids_and_names(db: None, name: Any, value: Any, instance_id: Any) -> None:
    before = WorkflowInstance.objects.count()
    with CaptureQueriesContext(connection) as queries:
        try:
            started = sv.start_workflow(name, value, instance_id=instance_id)
        except sv.WorkflowStartRejected:
            started = None
        except sv.WorkflowAlreadyStarted:
            assert WorkflowInstance.objects.filter(instance_id=instance_id).exists()
            return
    if started is None:
        assert len(queries) == 0, "a rejected start must not reach the database"
        assert WorkflowInstance.objects.count() == before
        return
    row = WorkflowInstance.objects.get(instance_id=started)
    assert instance_id is None or started == instance_id
    assert (row.workflow_name, row.status) == (name, "running")
    assert same_json(row.input, _roundtrip(value))
    # Only JSON that both databases can store in a JSON column (jsonb refuses NUL).
    assert encodable(value) and "\\u0000" not in json.dumps(value)


# -- find_instances --------------------------------------------------------------------------

paths = st.from_regex(r"[A-Za-z0-9_]{1,8}(\.[A-Za-z0-9_]{1,8}){0,3}", fullmatch=True) | any_text
aware = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)
tokens = (
    st.none()
    | any_text
    | st.integers()
    | st.builds(
        lambda raw: base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode(),
        st.text(any_char, max_size=60)
        | st.just('["2030-01-01T00:00:00", "x"]')
        | st.just('["2030-01-01T00:00:00+00:00", "x\\u0000"]'),
    )
)


@pytest.fixture
def some_instances(db: None) -> list[str]:
    ids = []
    for n, value in enumerate([{"a": 1}, {"a": {"b": "x"}}, {"c": [1, 2]}, "plain", None]):
        ids.append(sv.start_workflow("fault.flow", value, instance_id=f"find-{n}"))
    WorkflowInstance.objects.filter(instance_id="find-4").update(status="completed")
    return ids


def mostly(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> Any:
    """Valid three times in four, so that whole calls get past validation often."""
    return st.one_of(valid, valid, valid, invalid)


@FUZZ
@given(
    status=mostly(
        st.none() | st.sampled_from(["running", "completed", "failed", "cancelled"]), any_text
    ),
    workflow_name=st.none() | any_text,
    instance_id=st.none() | any_text,
    started_after=st.none() | aware,
    started_before=st.none() | aware,
    input_filters=mostly(
        st.none() | st.dictionaries(paths, json_values, max_size=3),
        st.lists(any_text, max_size=2) | any_text,
    ),
    limit=mostly(st.none() | st.integers(1, 60), st.integers() | st.booleans() | st.floats()),
    page_token=mostly(st.none(), tokens),
)
def test_find_instances_filters(
    some_instances: list[str],
    status: Any,
    workflow_name: Any,
    instance_id: Any,
    started_after: Any,
    started_before: Any,
    input_filters: Any,
    limit: Any,
    page_token: Any,
) -> None:
    kwargs = dict(
        status=status,
        workflow_name=workflow_name,
        instance_id=instance_id,
        started_after=started_after,
        started_before=started_before,
        input_filters=input_filters,
        page_token=page_token,
    )
    if limit is not None:
        kwargs["limit"] = limit
    with CaptureQueriesContext(connection) as queries:
        try:
            page = sv.find_instances(**kwargs)
        except ValueError:
            page = None
    if page is None:
        assert len(queries) == 0, "malformed filters must be refused before any query"
        return
    assert len(page.instances) <= (50 if limit is None else limit)
    for found in page.instances:
        assert found.instance_id in some_instances
        if status is not None:
            assert found.status == status
        # (Case folding beyond ASCII differs between Python and the databases.)
        if workflow_name and workflow_name.isascii():
            assert workflow_name.lower() in found.workflow_name.lower()
        if instance_id and instance_id.isascii():
            assert instance_id.lower() in found.instance_id.lower()
        if started_after is not None:
            assert found.started_at > started_after
        if started_before is not None:
            assert found.started_at < started_before


@pytest.mark.django_db
def test_find_instances_matches_input_paths(some_instances: list[str]) -> None:
    def ids(filters: dict[str, Any]) -> list[str]:
        return sorted(d.instance_id for d in sv.find_instances(input_filters=filters).instances)

    assert ids({"a": 1}) == ["find-0"]
    assert ids({"a.b": "x"}) == ["find-1"]
    assert ids({"c": [1, 2]}) == ["find-2"]
    assert ids({"a": 2}) == []


def test_the_fuzz_strategies_reach_what_must_be_refused() -> None:
    assert not encodable(math.nan) and not encodable({1, 2}) and not encodable("\ud800")
    assert encodable({"a": [1, None, "é"]})
    with pytest.raises(sv.WorkflowStartRejected, match="NUL"):
        sv.start_workflow("fault.flow", {"k": "a\x00b"})
    with pytest.raises(sv.InvalidSignalChannel):
        sv.signal("anything", "a\x00", 1)


# -- security: JSON paths and values are bound, never spliced into SQL ---------------------

path_parts = st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True)


@FUZZ
@given(
    parts=st.lists(
        st.from_regex(r"[0-9]{1,3}", fullmatch=True) | path_parts.map(lambda p: f"zqp{p}"),
        min_size=1,
        max_size=4,
    ),
    text=st.text(any_char, max_size=40).filter(lambda v: encodable(v) and "\x00" not in v),
)
def test_input_filter_paths_and_values_reach_the_database_only_as_parameters(
    some_instances: list[str], parts: list[str], text: str
) -> None:
    """The SQL text is the same whatever the path says; path and value travel as parameters."""

    def statements(filters: dict[str, Any]) -> list[tuple[str, str]]:
        injector = FaultInjector(trace=True).install()
        try:
            sv.find_instances(input_filters=filters)
        finally:
            injector.uninstall()
        return [(s.sql, s.params) for s in injector.statements]

    value = f"zqv{text}"
    fuzzed = statements({".".join(parts): value})
    # Digits-only parts are array indexes: keep each part's kind in the reference path.
    other = [f"{n}" if part.isdigit() else f"k{n}" for n, part in enumerate(parts)]
    reference = statements({".".join(other): value})
    assert [sql for sql, _ in fuzzed] == [sql for sql, _ in reference]
    (sql, params), *_ = fuzzed
    assert "zq" not in sql  # neither a path part nor the value
    assert "zqv" in params
    for part in parts:
        assert part in params or part.isdigit()


def test_a_hostile_path_is_refused_and_a_hostile_value_is_just_a_value(
    some_instances: list[str],
) -> None:
    for path in ("a') OR 1=1 --", "a;DROP TABLE x", "a.b'", "$.a", "a[0]", "a..b", ""):
        with pytest.raises(ValueError, match="invalid input filter path"):
            sv.find_instances(input_filters={path: 1})
    hostile = "x' OR '1'='1"
    assert sv.find_instances(input_filters={"a": hostile}).instances == []
    assert WorkflowInstance.objects.count() == len(some_instances)


# -- the admin's forms -------------------------------------------------------------------------

form_text = st.text(st.characters(codec="utf-8"), max_size=300)  # what a browser can send
form_json = json_values.map(lambda v: json.dumps(v))  # valid JSON text, escapes and all


@FUZZ
@given(channel=form_text, payload=form_text | form_json, reason=form_text)
def test_the_admin_signal_and_cancel_forms(
    running: str, channel: str, payload: str, reason: str
) -> None:
    """What the admin's views do with a POST: form errors or one write, never another error."""
    from selvedge_django.admin.forms import CancelForm, SignalForm

    before = SignalMessage.objects.count()
    form = SignalForm({"channel": channel, "payload": payload})
    sent = False
    if form.is_valid():
        try:  # as signal_view does: a SelvedgeError becomes a form error
            sv.signal(running, form.cleaned_data["channel"], form.cleaned_data["payload"])
            sent = True
        except sv.SelvedgeError:
            pass
    assert SignalMessage.objects.count() == before + sent
    if sent:
        latest = SignalMessage.objects.order_by("-id").first()
        assert latest is not None and latest.channel == channel
    cancel = CancelForm({"reason": reason})
    assert cancel.is_valid() == ("\x00" not in reason)


@pytest.mark.django_db
def test_the_admin_signal_view_shows_refused_input_as_form_errors(
    running: str, django_user_model: Any
) -> None:
    user = django_user_model.objects.create_superuser(username="fuzz", email="", password=None)
    client = Client()
    client.force_login(user)
    signal_url = reverse("admin:selvedge_django_workflowinstance_signal", args=(running,))
    for payload in ('"\\ud800"', "1e999", "[" * 5000, '{"a": NaN}'):
        response = client.post(signal_url, {"channel": "go", "payload": payload})
        assert response.status_code == 200, payload
    assert not SignalMessage.objects.exists()
    assert client.post(signal_url, {"channel": "go", "payload": "[1]"}).status_code == 302


# -- the nesting cap ---------------------------------------------------------------------


def _reference_depth(text: str) -> int:
    """The nesting depth of JSON text, character by character."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


_BRACKETY_TEXT = st.text(alphabet='[]{}"\\é\u2028ab', max_size=8)
_NESTED_JSON = st.recursive(
    st.none() | st.integers() | _BRACKETY_TEXT,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_BRACKETY_TEXT, children, max_size=3)
    ),
    max_leaves=40,
)


@FUZZ
@given(value=_NESTED_JSON, ascii_only=st.booleans())
def test_the_nesting_check_agrees_with_a_character_by_character_count(
    value: Any, ascii_only: bool
) -> None:
    from selvedge_django.engine.codec import nested_deeper_than

    text = json.dumps(value, ensure_ascii=ascii_only)
    depth = _reference_depth(text)
    for limit in {max(depth - 1, 0), depth, depth + 1}:
        assert nested_deeper_than(text, limit) == (depth > limit)
