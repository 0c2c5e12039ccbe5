"""Payload encryption at rest: SELVEDGE["PAYLOAD_CODEC"] and SELVEDGE["PAYLOAD_KEYS"].

The secret marker goes through every kind of stored value, and a raw read of
every text and JSON column of every table of the app finds it nowhere; what
users read (results, descriptions, task lists, exports, replay checks) is clear.
A worker without the key leaves an instance untouched beside one that has it;
rotation re-encrypts in resumable batches; turning the codec on or off keeps
every instance readable and replayable.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connections, models
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.codecs import FernetCodec, fernet_key_id
from selvedge_django.conf import get_settings
from selvedge_django.models import HistoryEvent, WorkflowInstance
from selvedge_django.operations import rotate_keys, status_report
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests import codec_workflows
from tests.conftest import wait_until

SECRET = "zq-SECRET-4471-marker"
KEY_A = FernetCodec.generate_key()
KEY_B = FernetCodec.generate_key()
FERNET = "selvedge_django.codecs.FernetCodec"

assert codec_workflows.carry.name == "codec.carry"


def selvedge(**extra: Any) -> Any:
    """override_settings of SELVEDGE with ``extra`` keys (None removes one)."""
    merged = {**settings.SELVEDGE, **extra}
    return override_settings(SELVEDGE={k: v for k, v in merged.items() if v is not None})


@pytest.fixture
def encrypted(tdb: None) -> Iterator[None]:
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_A]):
        yield


def raw_columns() -> Iterator[tuple[str, str, Any]]:
    """(table, column, value) of every text and JSON column of every table of the app,
    read with SQL (no model field decodes them)."""
    alias = get_settings().database
    connection = connections[alias]
    quote = connection.ops.quote_name
    for model in apps.get_app_config("selvedge_django").get_models():
        columns = [
            field.column
            for field in model._meta.concrete_fields
            if isinstance(field, models.CharField | models.TextField | models.JSONField)
        ]
        if not columns:
            continue
        table = model._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {', '.join(map(quote, columns))} FROM {quote(table)}")
            for row in cursor.fetchall():
                for column, value in zip(columns, row, strict=True):
                    yield table, column, value


def sv_table(model: str) -> str:
    return str(apps.get_model("selvedge_django", model)._meta.db_table)


def clear_text_hits(marker: str) -> list[tuple[str, str]]:
    return sorted({(t, c) for t, c, v in raw_columns() if v is not None and marker in str(v)})


def run_carry(instance_id: str) -> None:
    data = {"secret": SECRET, "id": instance_id}
    sv.start_workflow(codec_workflows.carry, data, instance_id=instance_id)
    run_until_idle(Worker())
    sv.signal(instance_id, "go", {"approved_by": SECRET})
    run_until_idle(Worker())


def test_the_secret_is_nowhere_in_clear_text_and_reads_back_clear(encrypted: None) -> None:
    sv.create_schedule("codec-nightly", codec_workflows.wait, cron="0 3 * * *", input=SECRET)
    run_carry("carry-1")
    # A fork copies the history; a resume from the refused step archives its rows and
    # a summary of its task (with the task's error).
    fork = sv.fork_workflow("carry-1")
    refuse_key = next(t.key for t in sv.list_activity_tasks("carry-1") if t.name == "codec.refuse")
    sv.resume_workflow("carry-1", from_key=refuse_key)
    run_until_idle(Worker())
    forked = sv.get_workflow_result(fork)
    assert forked.status == "completed", (forked.status, forked.error)
    assert forked.output["refused"] == f"refused {SECRET}"
    assert sv.export_history("carry-1").archived
    result = sv.get_workflow_result("carry-1")
    assert result.status == "completed", result.error
    assert result.output == {
        "echoed": {"echo": SECRET},
        "signal": {"approved_by": SECRET},
        "child": f"child saw {SECRET}",
        "refused": f"refused {SECRET}",
    }
    # Every kind of value was written: heartbeat details, an activity error, progress.
    assert sv.describe("carry-1").progress == {"step": "done", "about": SECRET}
    tasks = {task.name: task for task in sv.list_activity_tasks("carry-1")}
    assert tasks["codec.echo"].heartbeat_details == {"seen": SECRET}
    refused = tasks["codec.refuse"].last_error
    assert isinstance(refused, sv.ApplicationError)
    assert refused.type == "Refused" and refused.message == f"refused {SECRET}"
    assert refused.details == {"why": SECRET}
    assert sv.describe_schedule("codec-nightly").input == SECRET

    assert clear_text_hits(SECRET) == []
    # ... while names, ids and error type names stay clear.
    tasks_table = sv_table("ActivityTask")
    assert (tasks_table, "name") in clear_text_hits("codec.refuse")
    assert (tasks_table, "last_error") in clear_text_hits('"Refused"')
    assert (sv_table("WorkflowInstance"), "workflow_name") in clear_text_hits("codec.carry")

    # Exports and replay checks read through the codec.
    exported = sv.export_history("carry-1").to_json()
    assert SECRET in exported
    sv.replay_instance("carry-1")
    assert SECRET not in sv.export_history("carry-1", redact=True).to_json()


def test_queries_replay_through_the_codec(encrypted: None) -> None:
    sv.start_workflow(codec_workflows.queried, {"secret": SECRET}, instance_id="query-1")
    sv.signal("query-1", "go", SECRET)
    run_until_idle(Worker())
    assert sv.query("query-1", "seen") == {"input": {"secret": SECRET}, "payload": SECRET}
    with (
        selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_B]),
        pytest.raises(sv.PayloadDecodeError) as raised,
    ):
        sv.query("query-1", "seen")
    assert raised.value.key_id == fernet_key_id(KEY_A)


def test_every_stored_value_says_how_it_was_encoded(encrypted: None) -> None:
    sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id="env-1")
    stored = WorkflowInstance.objects.get(instance_id="env-1").input
    assert set(stored) == {"$codec", "key", "data"}
    assert stored["$codec"] == "fernet" and stored["key"] == fernet_key_id(KEY_A)


def test_a_worker_without_the_key_leaves_the_run_and_one_with_it_completes_it(
    encrypted: None, caplog: pytest.LogCaptureFixture
) -> None:
    sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id="keyless-1")
    sv.signal("keyless-1", "go", {"payload": SECRET})
    before = WorkflowInstance.objects.get(instance_id="keyless-1")
    caplog.set_level(logging.WARNING, logger="selvedge_django.worker")
    keyless = Worker(
        worker_id="keyless",
        payload_keys=[KEY_B],
        leader_heartbeat_interval=0.2,
        workflow_resumption_interval=0.05,
    )
    keyless.start()
    try:
        wait_until(lambda: "keyless-1" in keyless.runtime.undecodable.passed_over())
        # Untouched: still running, no history, the same input; the lease released.
        after = wait_until(
            lambda: (
                WorkflowInstance.objects.filter(instance_id="keyless-1", lease_owner="")
                .exclude(lease_epoch=before.lease_epoch)
                .first()
            )
        )
        assert after.status == "running" and after.runnable
        assert after.input == before.input and after.lease_epoch == before.lease_epoch + 1
        assert not HistoryEvent.objects.filter(instance_id="keyless-1").exists()
        # Reported: in its heartbeat row, hence in runselvedge status.
        wait_until(
            lambda: any(
                w["worker_id"] == "keyless"
                and {"instance_id": "keyless-1", "key_id": fernet_key_id(KEY_A)} in w["undecodable"]
                for w in status_report()["workers"]
            )
        )
        keyed = Worker(worker_id="keyed", workflow_resumption_interval=0.05)
        keyed.start()
        try:
            result = sv.wait_workflow("keyless-1", timeout=20)
        finally:
            keyed.stop(timeout=10)
    finally:
        keyless.stop(timeout=10)
    assert result.output == {"input": {"secret": SECRET}, "payload": {"payload": SECRET}}
    # Two leases in all: the keyless worker took it once and then passed it over.
    assert WorkflowInstance.objects.get(instance_id="keyless-1").lease_epoch == (
        before.lease_epoch + 2
    )
    said = [r for r in caplog.records if "keyless-1" in r.getMessage() and "decode" in r.msg]
    assert len(said) == 1


def test_an_activity_worker_without_the_key_gives_the_task_back_uncharged(
    encrypted: None,
) -> None:
    sv.start_workflow(codec_workflows.carry, {"secret": SECRET, "id": "act-1"}, instance_id="act-1")
    # The workflow's first execution reserves the activity; nothing runs it yet.
    worker = Worker(activity_queues=[])
    worker.resumptions.inline = True
    assert worker.dispatcher.run_once() == 1
    keyless = Worker(payload_keys=[KEY_B])
    keyless.activities.inline = True
    assert keyless.activity_poller.run_once() == 1
    task = sv.list_activity_tasks("act-1")[0]
    assert task.status == "queued" and task.failures == 0 and task.heartbeat_details is None
    assert keyless.activity_poller.run_once() == 0  # not claimed again at once
    assert keyless.runtime.attempts._undecodable == {("act-1", task.key)}


def test_rotation_is_bounded_resumable_and_leaves_every_value_readable(tdb: None) -> None:
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_A]):
        for n in range(3):
            run_carry(f"rot-{n}")
        # Archived rows, and the summary of an archived task with its error inside.
        tasks = sv.list_activity_tasks("rot-0")
        sv.resume_workflow("rot-0", from_key=next(t.key for t in tasks if t.name == "codec.refuse"))
        run_until_idle(Worker())
    old_id = fernet_key_id(KEY_A)
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_B, KEY_A]):
        batches: list[int] = []

        def crash_after_two(counts: Any) -> None:
            batches.append(counts.changed)
            if len(batches) == 2:
                raise KeyboardInterrupt("interrupted")

        with pytest.raises(KeyboardInterrupt):
            rotate_keys(batch_size=2, progress=crash_after_two)
        half = clear_text_hits(old_id)
        assert half, "the interrupted run left values under the old key"
        assert batches[-1] > 0
        for n in range(3):  # every value readable half-way
            assert sv.get_workflow_result(f"rot-{n}").output["echoed"] == {"echo": SECRET}
            assert SECRET in sv.export_history(f"rot-{n}").to_json()
        rest = rotate_keys(batch_size=2)
        assert rest.changed > 0 and rest.undecodable == 0
        assert clear_text_hits(old_id) == []
        assert rotate_keys(batch_size=50).changed == 0  # done: nothing left to write
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_B]):  # the old key retired
        for n in range(3):
            assert sv.get_workflow_result(f"rot-{n}").output["refused"] == f"refused {SECRET}"
            sv.replay_instance(f"rot-{n}")
        assert "carry" not in json.dumps(sv.describe("rot-0").progress)


def test_rotate_keys_command_prints_a_count(tdb: None, capsys: Any) -> None:
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_A]):
        sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id="cmd-1")
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_B, KEY_A]):
        call_command("runselvedge", "rotate-keys", "--batch", "10")
        assert capsys.readouterr().out.strip() == "re-encrypted 1 values"
        call_command("runselvedge", "rotate-keys")
        assert capsys.readouterr().out.strip() == "re-encrypted 0 values"


def test_turning_the_codec_on_and_off_keeps_every_instance_replayable(tdb: None) -> None:
    sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id="plain-1")
    run_until_idle(Worker())
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_A]):
        sv.signal("plain-1", "go", {"payload": SECRET})  # sealed, beside a plain input
        sv.start_workflow(codec_workflows.wait, {"secret": SECRET}, instance_id="sealed-1")
        run_until_idle(Worker())
        sv.replay_instance("plain-1")
        assert sv.get_workflow_result("plain-1").output["payload"] == {"payload": SECRET}
    # The codec off, its keys still configured: the sealed values still read.
    with selvedge(PAYLOAD_KEYS=[KEY_A]):
        sv.signal("sealed-1", "go", {"payload": "plain now"})
        run_until_idle(Worker())
        assert sv.get_workflow_result("sealed-1").output == {
            "input": {"secret": SECRET},
            "payload": {"payload": "plain now"},
        }
        sv.replay_instance("sealed-1")
        sv.replay_instance("plain-1")
        assert SECRET in sv.export_history("sealed-1").to_json()
    # Without the keys, reading a sealed value names the key it needs.
    assert sv.get_workflow_result("sealed-1").status == "completed"  # output stored plain
    with pytest.raises(sv.PayloadDecodeError) as raised:
        sv.get_workflow_result("plain-1")  # output stored while the codec was on
    assert raised.value.key_id == fernet_key_id(KEY_A)


def test_system_checks_name_a_codec_without_keys_and_keys_that_are_not_fernet_keys(
    tdb: None,
) -> None:
    def ids() -> set[str]:
        return {m.id for m in run_checks(tags=["selvedge"]) if m.id}

    with selvedge(PAYLOAD_CODEC=FERNET):
        assert "selvedge.E008" in ids()
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=[KEY_A, "not-a-fernet-key"]):
        assert "selvedge.E009" in ids()
    with selvedge(PAYLOAD_CODEC=FERNET, PAYLOAD_KEYS=lambda: [KEY_A]):
        assert not {"selvedge.E008", "selvedge.E009", "selvedge.E003"} & ids()


def test_input_filters_with_a_codec_raise_a_clear_value_error(encrypted: None) -> None:
    with pytest.raises(ValueError, match="attributes"):
        sv.find_instances(input_filters={"secret": SECRET})


def test_undecodable_values_never_fail_a_run_in_worker_threads(encrypted: None) -> None:
    """Many instances, two workers, one without the key: all complete, none failed."""
    ids = [f"many-{n}" for n in range(12)]
    for iid in ids:
        sv.start_workflow(codec_workflows.wait, {"n": iid, "secret": SECRET}, instance_id=iid)
        sv.signal(iid, "go", SECRET)
    keyless = Worker(payload_keys=[KEY_B], workflow_resumption_interval=0.05)
    keyed = Worker(workflow_resumption_interval=0.05)
    keyless.start()
    keyed.start()
    try:
        results = [sv.wait_workflow(iid, timeout=30) for iid in ids]
    finally:
        keyed.stop(timeout=10)
        keyless.stop(timeout=10)
    assert [r.status for r in results] == ["completed"] * len(ids)
    assert [r.output["payload"] for r in results] == [SECRET] * len(ids)


def test_django_tasks_arguments_results_and_errors_are_encrypted(
    encrypted: None, task_calls: Any
) -> None:
    if (
        importlib.util.find_spec("django.tasks") is None
        and importlib.util.find_spec("django_tasks") is None
    ):
        pytest.skip("neither django.tasks nor the django-tasks backport")
    from tests.testapp import tasks

    sent = tasks.send_email.enqueue(SECRET, subject=SECRET)
    failed = tasks.once.enqueue(SECRET)
    run_until_idle(Worker())
    sent.refresh()
    failed.refresh()
    assert sent.return_value == {"to": SECRET, "subject": SECRET}
    assert failed.errors and SECRET in failed.errors[-1].traceback
    assert clear_text_hits(SECRET) == []


@pytest.mark.parametrize(
    "name", ["order_completed.json", "order_running.json", "order_failed.json"]
)
def test_checked_in_plain_histories_replay_unchanged_with_a_codec(
    encrypted: None, name: str
) -> None:
    from tests import ops_workflows

    assert ops_workflows.order.name == "ops.golden.order"
    histories = Path(__file__).resolve().parents[1] / "histories"
    sv.replay_history(sv.parse_history((histories / name).read_text()))
