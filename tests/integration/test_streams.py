"""Streams (SPEC section 17): workflow writes are commands, activity writes are live.

Real databases and real worker threads: a reader in the test's thread reads an
activity's entries while the attempt still runs; replays on another worker, from
the workflow cache and in replay checks write nothing new; a retried activity's
entries carry each attempt; bounds, closing, timeouts and unknown ids behave as the
contract says; export, prune and the Server-Sent Events response include them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import AsyncClient, Client, RequestFactory, override_settings

import selvedge_django as sv
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowStream, WorkflowStreamEntry
from selvedge_django.operations import REDACTED, prune
from selvedge_django.streams import event_stream_response
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.workflows.streams import (
    answer,
    big,
    closed,
    many,
    release,
    retried,
    run_once,
    steps,
)


def entries(iid: str, key: str) -> list[tuple[int, Any, int | None]]:
    return [(e.seq, e.value, e.attempt) for e in sv.read_stream(iid, key, timeout=0)]


def stored(iid: str, key: str) -> list[tuple[int, str, int | None]]:
    return list(
        WorkflowStreamEntry.objects.filter(instance_id=iid, key=key)
        .order_by("seq")
        .values_list("seq", "value", "attempt")
    )


# -- workflow writes are commands ---------------------------------------------------------


@pytest.mark.parametrize("cache", [0, 100])
def test_workflow_writes_are_recorded_once_whoever_replays(tdb: None, cache: int) -> None:
    iid = sv.start_workflow(steps, 3)
    run_until_idle(Worker(worker_id="first", workflow_cache={"MAX_ENTRIES": cache}))
    assert [s[0] for s in stored(iid, "steps")] == [1, 2, 3]
    sv.signal(iid, "go")
    # Another worker replays the three writes from history, then writes the fourth.
    run_until_idle(Worker(worker_id="second", workflow_cache={"MAX_ENTRIES": cache}))
    assert sv.get_workflow_result(iid).output == [1, 2, 3, 4]
    assert entries(iid, "steps") == [
        (1, {"step": 0}, None),
        (2, {"step": 1}, None),
        (3, {"step": 2}, None),
        (4, {"step": "after the signal"}, None),
    ]
    sv.replay_instance(iid)  # a replay check writes nothing either
    assert len(stored(iid, "steps")) == 4
    commands = HistoryEvent.objects.filter(instance_id=iid, command__startswith="stream")
    assert sorted(commands.values_list("event_type", flat=True)) == [
        "StreamClosed",
        *["StreamWritten"] * 4,
    ]


def test_a_cached_execution_writes_each_entry_once(tdb: None) -> None:
    iid = sv.start_workflow(steps, 2)
    worker = Worker(workflow_cache={"MAX_ENTRIES": 100})
    run_until_idle(worker)
    sv.signal(iid, "go")
    run_until_idle(worker)  # resumed from the cache: no replay of the first writes
    assert [s[0] for s in stored(iid, "steps")] == [1, 2, 3]
    assert sv.get_workflow_result(iid).status == "completed"


def test_a_write_after_close_raises_stream_closed_live_and_in_replay(tdb: None) -> None:
    iid = sv.start_workflow(closed)
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == "refused: log"
    assert entries(iid, "log") == [(1, "one", None)]
    sv.replay_instance(iid)


# -- activity writes are live, tagged with the attempt --------------------------------------


def test_a_reader_sees_an_activity_entry_while_the_attempt_runs(tdb: None) -> None:
    release.clear()
    iid = sv.start_workflow(answer, ["Hello", "world"])
    with Worker():
        reader = sv.read_stream(iid, "tokens", timeout=20)
        first = next(reader)
        # The attempt is still waiting on the event: its entry is already readable.
        assert (first.seq, first.value, first.attempt) == (1, "Hello", 1)
        assert first.activity_id is not None
        assert sv.list_activity_tasks(iid)[0].status == "running"
        release.set()
        rest = list(reader)  # woken by the second write, ended by the close
        assert [(e.seq, e.value) for e in rest] == [(2, "world")]
        assert sv.wait_workflow(iid, timeout=20).output == 2


def test_a_retried_activity_keeps_every_attempt_s_entries_tagged(tdb: None) -> None:
    iid = sv.start_workflow(retried, 2)
    with Worker():
        assert sv.wait_workflow(iid, timeout=30).output == "done"
    got = entries(iid, "rows")  # the instance closed: the read ends
    assert got == [
        (1, {"row": 0, "attempt": 1}, 1),
        (2, {"row": 1, "attempt": 1}, 1),
        (3, {"row": 0, "attempt": 2}, 2),
        (4, {"row": 1, "attempt": 2}, 2),
    ]


def test_write_stream_outside_an_activity_raises(tdb: None) -> None:
    with pytest.raises(sv.NotActivityContext):
        sv.write_stream("k", 1)


def test_an_activity_write_is_refused_once_the_instance_closed(tdb: None) -> None:
    from selvedge_django.engine.ports import TaskClaim
    from selvedge_django.operations import client_store

    iid = sv.start_workflow(run_once, "early")
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == 1
    task = ActivityTask.objects.get(instance_id=iid)
    claim = TaskClaim(task.id, iid, task.key, task.claim_owner, task.claim_epoch)
    with pytest.raises(sv.StreamClosed):
        client_store().streams.write_live(claim, "once", '"late"', 1)
    assert stored(iid, "once") == [(1, '"early"', 1)]


# -- readers ------------------------------------------------------------------------------


def test_after_timeout_and_unknown_ids(tdb: None) -> None:
    iid = sv.start_workflow(steps, 3)
    run_until_idle(Worker())
    reader = sv.read_stream(iid, "steps", after=1, timeout=0.2)
    assert [next(reader).seq, next(reader).seq] == [2, 3]
    reader = sv.read_stream(iid, "steps", after=3, timeout=0.2)
    with pytest.raises(TimeoutError):
        next(reader)
    with pytest.raises(sv.WorkflowNotFound):
        next(sv.read_stream("nobody", "steps"))
    with pytest.raises(ValueError):
        next(sv.read_stream(iid, ""))
    with pytest.raises(ValueError):
        next(sv.read_stream(iid, "steps", after=-1))
    # A stream nobody wrote to, of a running instance: nothing yet, then the timeout.
    with pytest.raises(TimeoutError):
        next(sv.read_stream(iid, "other", timeout=0.1))


def test_a_read_is_one_statement_and_a_closed_stream_ends_after_its_last_batch(
    tdb: None,
) -> None:
    """A reader's wake-up costs one round trip: the instance's status, whether the
    stream is closed and a batch of entries, in seq order, read together."""
    from django.test.utils import CaptureQueriesContext

    from selvedge_django.operations import client_store

    iid = sv.start_workflow(steps, 3)
    run_until_idle(Worker())
    store = client_store()
    with CaptureQueriesContext(connection) as captured:
        found = store.streams.read(iid, "steps", 1, 1)
    assert len(captured.captured_queries) == 1
    assert [(e.seq, json.loads(e.value)) for e in found.entries] == [(2, {"step": 1})]
    assert not found.closed and found.entries[0].written_at.utcoffset() == timedelta(0)
    assert store.streams.read(iid, "steps", 3, 10).entries == []
    assert not store.streams.read(iid, "other", 0, 10).closed  # nobody wrote to it

    sv.signal(iid, "go", None)
    run_until_idle(Worker())
    first = store.streams.read(iid, "steps", 0, 3)  # closed, but a full batch: more may follow
    assert ([e.seq for e in first.entries], first.closed) == ([1, 2, 3], True)
    assert [e.seq for e in store.streams.read(iid, "steps", 3, 3).entries] == [4]
    assert [e.seq for e in sv.read_stream(iid, "steps", after=2)] == [3, 4]
    with pytest.raises(sv.WorkflowNotFound):
        store.streams.read("nobody", "steps", 0, 10)


def test_a_waiting_reader_wakes_on_a_write_from_another_thread(tdb: None) -> None:
    iid = sv.start_workflow(steps, 1)
    run_until_idle(Worker())
    got: list[Any] = []
    started = threading.Event()

    def read() -> None:
        try:
            reader = sv.read_stream(iid, "steps", after=1, timeout=20)
            started.set()
            got.extend(e.value for e in reader)
        finally:
            connection.close()

    thread = threading.Thread(target=read)
    thread.start()
    assert started.wait(10)
    sv.signal(iid, "go")
    run_until_idle(Worker())
    thread.join(20)
    assert got == [{"step": "after the signal"}]


def test_the_async_reader(tdb: None) -> None:
    iid = sv.start_workflow(steps, 2)
    run_until_idle(Worker())
    sv.signal(iid, "go")
    run_until_idle(Worker())

    async def read() -> list[int]:
        return [e.seq async for e in sv.aread_stream(iid, "steps", after=1, timeout=5)]

    try:
        assert asyncio.run(read()) == [2, 3]
    finally:
        # sync_to_async's thread keeps its connection past the test: close it, or the
        # test database cannot be dropped.
        asyncio.run(sync_to_async(connections.close_all)())


# -- bounds ---------------------------------------------------------------------------------


def test_max_stream_entries_refuses_with_nothing_written(tdb: None) -> None:
    with override_settings(SELVEDGE={**_settings(), "MAX_STREAM_ENTRIES": 3}):
        iid = sv.start_workflow(many, 5)
        run_until_idle(Worker(workflow_cache={"MAX_ENTRIES": 0}))
        assert sv.get_workflow_result(iid).output == [1, 2, 3, "full", "full"]
        assert len(stored(iid, "many")) == 3
        sv.replay_instance(iid)  # the refusals replay from history


def test_an_oversize_value_raises_payload_too_large_and_writes_nothing(tdb: None) -> None:
    with override_settings(SELVEDGE={**_settings(), "MAX_PAYLOAD_BYTES": 1000}):
        iid = sv.start_workflow(big, 2000)
        run_until_idle(Worker())
        assert sv.get_workflow_result(iid).output == "too large"
    assert stored(iid, "big") == []
    assert not WorkflowStream.objects.filter(instance_id=iid).exists()


def _settings() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.SELVEDGE)


# -- export, prune, Server-Sent Events -----------------------------------------------------


def test_streams_are_exported_redacted_and_pruned(tdb: None) -> None:
    iid = sv.start_workflow(steps, 1)
    run_until_idle(Worker())
    sv.signal(iid, "go")
    run_until_idle(Worker())
    exported = json.loads(sv.export_history(iid).to_json())
    assert exported["streams"] == [
        {"key": "steps", "seq": 1, "value": {"step": 0}, "attempt": None},
        {"key": "steps", "seq": 2, "value": {"step": "after the signal"}, "attempt": None},
    ]
    redacted = json.loads(sv.export_history(iid, redact=True).to_json())
    assert all(set(s["value"]) == {REDACTED} for s in redacted["streams"])
    assert {"step": 0} not in [s["value"] for s in redacted["streams"]]
    assert sv.parse_history(sv.export_history(iid).to_json()).streams
    assert prune(timedelta(0)) >= 1
    assert not WorkflowStreamEntry.objects.filter(instance_id=iid).exists()
    assert not WorkflowStream.objects.filter(instance_id=iid).exists()


def _events(body: str) -> list[str]:
    blocks = [block for block in body.split("\n\n") if block]
    assert blocks[0] == "retry: 1000"  # the browser's reconnect delay comes first
    return blocks[1:]


def test_event_stream_response_through_the_test_client(tdb: None, client: Client) -> None:
    iid = sv.start_workflow(steps, 2)
    run_until_idle(Worker())
    sv.signal(iid, "go")
    run_until_idle(Worker())
    response = client.get(f"/streams/{iid}/steps/")
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    events = _events(b"".join(response.streaming_content).decode())  # type: ignore[attr-defined]
    assert [e.split("\n")[0] for e in events] == ["id: 1", "id: 2", "id: 3", "event: end"]
    first = json.loads(events[0].split("data: ", 1)[1])
    assert first["value"] == {"step": 0} and first["seq"] == 1 and first["attempt"] is None
    # A browser's reconnect: after the last id it saw.
    again = client.get(f"/streams/{iid}/steps/", headers={"Last-Event-ID": "2"})
    events = _events(b"".join(again.streaming_content).decode())  # type: ignore[attr-defined]
    assert [e.split("\n")[0] for e in events] == ["id: 3", "event: end"]
    with pytest.raises(sv.WorkflowNotFound):
        event_stream_response(RequestFactory().get("/"), "nobody", "steps")


def test_event_stream_response_from_an_async_view(tdb: None) -> None:
    iid = sv.start_workflow(steps, 1)
    run_until_idle(Worker())
    sv.signal(iid, "go")
    run_until_idle(Worker())

    async def fetch() -> list[str]:
        response = await AsyncClient().get(
            f"/astreams/{iid}/steps/", headers={"Last-Event-ID": "1"}
        )
        assert response["Content-Type"] == "text/event-stream"
        chunks = [chunk async for chunk in response.streaming_content]
        return _events(b"".join(chunks).decode())

    try:
        events = asyncio.run(fetch())
    finally:
        asyncio.run(sync_to_async(connections.close_all)())
    assert [e.split("\n")[0] for e in events] == ["id: 2", "event: end"]


def test_keepalive_comments_while_nothing_is_new(tdb: None) -> None:
    iid = sv.start_workflow(steps, 1)
    run_until_idle(Worker())
    response = event_stream_response(RequestFactory().get("/"), iid, "steps", keepalive=0.05)
    content = iter(response.streaming_content)
    assert next(content) == b"retry: 1000\n\n"
    assert next(content).startswith(b"id: 1\n")
    assert next(content) == b": keep-alive\n\n"  # the stream is open, nothing new


def test_max_seconds_ends_the_response_without_the_end_event(tdb: None) -> None:
    iid = sv.start_workflow(steps, 2)
    run_until_idle(Worker())
    request = RequestFactory().get("/")
    response = event_stream_response(request, iid, "steps", keepalive=0.05, max_seconds=0.3)
    events = _events(b"".join(response.streaming_content).decode())  # type: ignore[attr-defined]
    assert events[:2] == [e for e in events[:2] if e.startswith("id: ")]
    assert "event: end" not in "".join(events)  # the stream is open: the browser reconnects


def test_a_live_write_is_refused_past_the_limit_or_without_the_claim(tdb: None) -> None:
    from selvedge_django.engine.ports import TaskClaim
    from selvedge_django.operations import client_store

    release.clear()
    iid = sv.start_workflow(answer, ["one", "two"])
    store = client_store()
    with Worker():
        assert next(sv.read_stream(iid, "tokens", timeout=20)).value == "one"
        task = ActivityTask.objects.get(instance_id=iid)  # running: the attempt waits
        claim = TaskClaim(task.id, iid, task.key, task.claim_owner, task.claim_epoch)
        store.options.max_stream_entries = 1
        try:
            with pytest.raises(sv.StreamLimitExceeded):
                store.streams.write_live(claim, "tokens", '"over"', 1)
        finally:
            store.options.max_stream_entries = 100_000
        stale = TaskClaim(task.id, iid, task.key, task.claim_owner, task.claim_epoch - 1)
        with pytest.raises(sv.ActivityCancelled):
            store.streams.write_live(stale, "tokens", '"stale"', 1)
        assert stored(iid, "tokens") == [(1, '"one"', 1)]  # neither wrote anything
        release.set()
        assert sv.wait_workflow(iid, timeout=20).output == 2
    assert [e.value for e in sv.read_stream(iid, "tokens", timeout=1)] == ["one", "two"]


def test_a_waiting_reader_ends_when_the_instance_is_terminated(tdb: None) -> None:
    iid = sv.start_workflow(steps, 1)
    run_until_idle(Worker())
    ended = threading.Event()
    got: list[int] = []

    def read() -> None:
        try:
            got.extend(e.seq for e in sv.read_stream(iid, "steps", timeout=120))
            ended.set()
        finally:
            connection.close()

    # A poll interval far beyond the test's wait: only the close's wake-up can end it.
    with override_settings(SELVEDGE={**_settings(), "WAIT_POLL_INTERVAL": 60}):
        thread = threading.Thread(target=read)
        thread.start()
        wait_until(lambda: got == [1] or None, timeout=10)
        sv.terminate_workflow(iid, reason="stop streaming")
        assert ended.wait(10), "the reader slept through the instance's close"
        thread.join(10)
    assert got == [1]


def test_stream_values_are_encrypted_at_rest_with_a_payload_codec(tdb: None) -> None:
    from django.db import connection as conn

    from selvedge_django.codecs import FernetCodec

    secret = "card 4242-4242-4242-4242"
    codec = {"PAYLOAD_CODEC": "selvedge_django.codecs.FernetCodec"}
    with override_settings(
        SELVEDGE={**_settings(), **codec, "PAYLOAD_KEYS": [FernetCodec.generate_key()]}
    ):
        flow = sv.start_workflow(steps, 1)
        activity = sv.start_workflow(run_once, secret)
        run_until_idle(Worker())
        table = conn.ops.quote_name(WorkflowStreamEntry._meta.db_table)
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT value FROM {table}")
            stored_values = [row[0] for row in cursor.fetchall()]
        assert len(stored_values) == 2
        assert all('"$codec"' in text and "step" not in text for text in stored_values)
        assert not any(secret in text for text in stored_values)
        # Readers, exports and the admin's reads get the clear values back.
        assert next(sv.read_stream(flow, "steps", timeout=5)).value == {"step": 0}
        assert [e.value for e in sv.read_stream(activity, "once", timeout=5)] == [secret]
        assert sv.export_history(activity).streams[0].value == secret
        assert secret not in sv.export_history(activity, redact=True).to_json()
