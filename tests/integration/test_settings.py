"""The SELVEDGE settings: defaults, validation, system checks and per-worker overrides."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from selvedge_django import conf
from selvedge_django.hooks import WorkflowHooks
from selvedge_django.worker import Worker
from tests.conftest import ROOT

SAFE_LEASE = {"TTL": 30, "RENEW_INTERVAL": 10, "MARGIN": 5, "MAX_SKEW": 1}

UNSAFE_LEASES = [
    pytest.param(
        {"TTL": 10, "RENEW_INTERVAL": 5, "MARGIN": 5, "MAX_SKEW": 1}, id="renew+margin=ttl"
    ),
    pytest.param(
        {"TTL": 10, "RENEW_INTERVAL": 8, "MARGIN": 4, "MAX_SKEW": 1}, id="renew+margin>ttl"
    ),
    pytest.param(
        {"TTL": 10, "RENEW_INTERVAL": 1, "MARGIN": 8, "MAX_SKEW": 2}, id="margin+skew=ttl"
    ),
    pytest.param(
        {"TTL": 10, "RENEW_INTERVAL": 1, "MARGIN": 5, "MAX_SKEW": 6}, id="margin+skew>ttl"
    ),
    pytest.param({"TTL": 0, "RENEW_INTERVAL": 1, "MARGIN": 1, "MAX_SKEW": 1}, id="zero-ttl"),
    pytest.param({"TTL": 30, "RENEW_INTERVAL": -1, "MARGIN": 5, "MAX_SKEW": 1}, id="negative"),
    pytest.param({"TTL": 30, "RENEW_INTERVAL": 10, "MARGIN": 5, "MAX_SKEW": 0}, id="zero-skew"),
    pytest.param({"TTL": math.nan, "RENEW_INTERVAL": 10, "MARGIN": 5}, id="nan"),
    pytest.param({"TTL": "30"}, id="string"),
    pytest.param({**SAFE_LEASE, "ttl": 30}, id="unknown-key"),
    pytest.param(
        {
            "TTL": timedelta(seconds=10),
            "RENEW_INTERVAL": timedelta(seconds=6),
            "MARGIN": timedelta(seconds=4),
        },
        id="timedeltas",
    ),
]


def selvedge(**changes: Any) -> dict[str, Any]:
    """The test suite's SELVEDGE dict with some keys changed."""
    return {**settings.SELVEDGE, **changes}


# -- resolve_settings -------------------------------------------------------------------


def test_defaults() -> None:
    s = conf.resolve_settings({})
    assert s.database == "default"
    assert s.worker_id  # generated when not set
    assert s.service_name == ""
    assert s.max_concurrent_activities == 10
    assert s.max_concurrent_resumptions == 10
    assert s.activity_queues is None
    assert s.activity_poll_interval == 1.0
    assert s.max_poll_interval == 60.0
    assert s.wait_poll_interval == 1.0
    assert s.workflow_resumption_interval == 1.0
    assert s.max_workflows_per_batch == 100
    assert s.max_timers_per_batch == 100
    assert (s.lease.ttl, s.lease.renew_interval, s.lease.margin, s.lease.max_skew) == (
        30.0,
        10.0,
        5.0,
        1.0,
    )
    assert s.leader_lease_duration == 45.0
    assert s.leader_heartbeat_interval == 15.0
    assert s.listen_notify is None
    assert s.hooks is None
    now = s.clock()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert conf.resolve_settings(None).max_concurrent_activities == 10


def test_generated_worker_ids_differ() -> None:
    assert conf.resolve_settings({}).worker_id != conf.resolve_settings({}).worker_id
    assert conf.resolve_settings({"WORKER_ID": "web-1"}).worker_id == "web-1"


def test_the_worker_id_setting_names_every_worker_given_no_id() -> None:
    with override_settings(SELVEDGE={**settings.SELVEDGE, "WORKER_ID": "web-1"}):
        assert Worker().worker_id == "web-1"
        assert Worker().runtime.worker_id == "web-1"
        assert Worker(worker_id="web-2").worker_id == "web-2"
        # Other overrides keep the configured id.
        assert Worker(max_concurrent_activities=2).worker_id == "web-1"
    unset = {k: v for k, v in settings.SELVEDGE.items() if k != "WORKER_ID"}
    with override_settings(SELVEDGE=unset):
        first, second = Worker(), Worker()
        assert first.worker_id != second.worker_id
        assert first.worker_id != conf.get_settings().worker_id


def test_durations_accept_numbers_and_timedeltas() -> None:
    s = conf.resolve_settings(
        {
            "ACTIVITY_POLL_INTERVAL": timedelta(milliseconds=250),
            "MAX_POLL_INTERVAL": 5,
            "WAIT_POLL_INTERVAL": 0.5,
            "SHUTDOWN_TIMEOUT": timedelta(minutes=1),
            "LEASE": {
                "TTL": timedelta(minutes=1),
                "RENEW_INTERVAL": 20,
                "MARGIN": timedelta(seconds=10),
                "MAX_SKEW": 2.5,
            },
        }
    )
    assert s.activity_poll_interval == 0.25
    assert s.max_poll_interval == 5.0
    assert s.wait_poll_interval == 0.5
    assert s.shutdown_timeout == 60.0
    assert (s.lease.ttl, s.lease.renew_interval, s.lease.margin, s.lease.max_skew) == (
        60.0,
        20.0,
        10.0,
        2.5,
    )


def test_partial_lease_keeps_the_other_defaults() -> None:
    s = conf.resolve_settings({"LEASE": {"TTL": 60}})
    assert (s.lease.ttl, s.lease.renew_interval, s.lease.margin, s.lease.max_skew) == (
        60.0,
        10.0,
        5.0,
        1.0,
    )


def test_activity_queues() -> None:
    assert conf.resolve_settings({"ACTIVITY_QUEUES": ["a", "b"]}).activity_queues == ("a", "b")
    assert conf.resolve_settings({"ACTIVITY_QUEUES": []}).activity_queues == ()  # none
    assert conf.resolve_settings({"ACTIVITY_QUEUES": None}).activity_queues is None  # all


def test_clock_and_hooks_accept_dotted_paths() -> None:
    s = conf.resolve_settings(
        {"CLOCK": "django.utils.timezone.now", "HOOKS": "selvedge_django.hooks.WorkflowHooks"}
    )
    assert isinstance(s.clock(), datetime)
    assert isinstance(s.hooks, WorkflowHooks)

    def fixed() -> datetime:
        return datetime(2031, 1, 1, tzinfo=UTC)

    assert conf.resolve_settings({"CLOCK": fixed}).clock() == datetime(2031, 1, 1, tzinfo=UTC)


def test_unknown_keys_are_rejected() -> None:
    with pytest.raises(ImproperlyConfigured, match="MAX_ACTIVITIES"):
        conf.resolve_settings({"MAX_ACTIVITIES": 3})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ACTIVITY_POLL_INTERVAL", 0),
        ("ACTIVITY_POLL_INTERVAL", -1),
        ("WAIT_POLL_INTERVAL", math.nan),
        ("MAX_POLL_INTERVAL", math.inf),
        ("WORKFLOW_RESUMPTION_INTERVAL", "1"),
        ("SHUTDOWN_TIMEOUT", timedelta(0)),
        ("LEADER_LEASE_DURATION", True),
        ("MAX_CONCURRENT_ACTIVITIES", 0),
        ("MAX_CONCURRENT_RESUMPTIONS", -2),
        ("MAX_WORKFLOWS_PER_BATCH", 1.5),
        ("MAX_TIMERS_PER_BATCH", True),
        ("MAX_WORKFLOWS_PER_BATCH", 5001),
        ("MAX_TIMERS_PER_BATCH", 10**6),
        ("SHUTDOWN_TIMEOUT", 1e12),
        ("ACTIVITY_QUEUES", "billing"),
        ("ACTIVITY_QUEUES", ["a", 1]),
        ("LISTEN_NOTIFY", "yes"),
        ("LISTEN_DATABASE", "no-such-alias"),
        ("LISTEN_DATABASE", 1),
        ("DATABASE", "no-such-alias"),
        ("CLOCK", 42),
        ("CLOCK", "no_such_module.clock"),
        ("CLOCK", "os"),
        ("HOOKS", "selvedge_django.hooks.NoSuchHooks"),
        ("LEASE", [30, 10, 5, 1]),
    ],
)
def test_invalid_values_are_rejected(key: str, value: Any) -> None:
    with pytest.raises(ImproperlyConfigured):
        conf.resolve_settings({key: value})


def test_settings_must_be_a_dict() -> None:
    with pytest.raises(ImproperlyConfigured):
        conf.resolve_settings(["LEASE"])  # type: ignore[arg-type]


def test_leader_heartbeat_must_be_shorter_than_the_leader_lease() -> None:
    with pytest.raises(ImproperlyConfigured, match="LEADER_HEARTBEAT_INTERVAL"):
        conf.resolve_settings({"LEADER_LEASE_DURATION": 10, "LEADER_HEARTBEAT_INTERVAL": 10})


def test_safe_lease_is_accepted() -> None:
    s = conf.resolve_settings(
        {"LEASE": {"TTL": 10, "RENEW_INTERVAL": 4, "MARGIN": 5, "MAX_SKEW": 4}}
    )
    assert s.lease.ttl == 10.0


@pytest.mark.parametrize("lease", UNSAFE_LEASES)
def test_unsafe_lease_is_improperly_configured(lease: dict[str, Any]) -> None:
    with pytest.raises(ImproperlyConfigured, match="LEASE"):
        conf.resolve_settings({"LEASE": lease})


@pytest.mark.parametrize("lease", UNSAFE_LEASES)
def test_worker_refuses_an_unsafe_lease(lease: dict[str, Any]) -> None:
    with pytest.raises(ImproperlyConfigured, match="LEASE"):
        Worker(lease=lease)


def test_worker_refuses_unknown_overrides() -> None:
    with pytest.raises(ImproperlyConfigured, match="max_activities"):
        Worker(max_activities=4)


def test_worker_overrides_apply_to_that_worker_only() -> None:
    before = conf.get_settings()
    lease = {"TTL": 9, "RENEW_INTERVAL": 3, "MARGIN": 2, "MAX_SKEW": 1}
    w = Worker(max_concurrent_activities=4, activity_queues=["a"], lease=lease)
    assert w.settings.max_concurrent_activities == 4
    assert w.settings.activity_queues == ("a",)
    assert (w.settings.lease.ttl, w.settings.lease.renew_interval) == (9.0, 3.0)
    # Keys not overridden come from settings.SELVEDGE.
    assert w.settings.wait_poll_interval == settings.SELVEDGE["WAIT_POLL_INTERVAL"]
    assert conf.get_settings() is before
    assert (before.max_concurrent_activities, before.activity_queues) != (4, ("a",))
    assert Worker(worker_id="fixed").worker_id == "fixed"


# -- lazy, cached, and reset by override_settings ---------------------------------------


def test_settings_are_cached_and_follow_override_settings() -> None:
    base = conf.get_settings()
    assert conf.get_settings() is base
    assert base.wait_poll_interval == settings.SELVEDGE["WAIT_POLL_INTERVAL"]
    with override_settings(SELVEDGE=selvedge(MAX_CONCURRENT_ACTIVITIES=3, SERVICE_NAME="shop")):
        overridden = conf.get_settings()
        assert overridden.max_concurrent_activities == 3
        assert overridden.service_name == "shop"
        assert Worker().settings.max_concurrent_activities == 3
    after = conf.get_settings()
    assert after.max_concurrent_activities == base.max_concurrent_activities != 3
    assert after.service_name == base.service_name != "shop"


def test_empty_selvedge_setting_means_defaults() -> None:
    with override_settings(SELVEDGE={}):
        s = conf.get_settings()
        assert s.lease.ttl == 30.0
        assert s.wait_poll_interval == 1.0
    assert conf.get_settings().lease.ttl == settings.SELVEDGE["LEASE"]["TTL"]


# -- system checks ----------------------------------------------------------------------


def selvedge_messages() -> list[Any]:
    """The selvedge checks' messages that are not silenced (tests/settings.py silences W003)."""
    return [
        m
        for m in run_checks(tags=["selvedge"])
        if m.id and m.id.startswith("selvedge.") and not m.is_silenced()
    ]


def test_the_test_settings_pass_the_checks() -> None:
    assert selvedge_messages() == []


@pytest.mark.parametrize("lease", UNSAFE_LEASES)
def test_unsafe_lease_is_error_e002(lease: dict[str, Any]) -> None:
    with override_settings(SELVEDGE=selvedge(LEASE=lease)):
        messages = selvedge_messages()
    assert messages
    assert {m.id for m in messages} == {"selvedge.E002"}
    assert all(m.is_serious() and m.hint for m in messages)


def test_each_unsafe_lease_rule_is_reported() -> None:
    lease = {"TTL": 10, "RENEW_INTERVAL": 6, "MARGIN": 5, "MAX_SKEW": 5}
    with override_settings(SELVEDGE=selvedge(LEASE=lease)):
        messages = selvedge_messages()
    text = " | ".join(m.msg for m in messages)
    assert len(messages) == 2
    assert "RENEW_INTERVAL + MARGIN" in text
    assert "MARGIN + MAX_SKEW" in text


@pytest.mark.parametrize(
    "changes",
    [
        {"MAX_CONCURRENT_ACTIVITIES": 0},
        {"WAIT_POLL_INTERVAL": -1},
        {"DATABASE": "no-such-alias"},
        {"UNKNOWN_SETTING": 1},
        {"CLOCK": "no_such_module.clock"},
        {"HOOKS": "no_such_module.Hooks"},
        {"RENEWAL_DATABASE": "no-such-alias"},
    ],
)
def test_invalid_settings_are_error_e003(changes: dict[str, Any]) -> None:
    with override_settings(SELVEDGE=selvedge(**changes)):
        messages = selvedge_messages()
    assert [m.id for m in messages] == ["selvedge.E003"]
    assert messages[0].is_serious()


def _check_in_subprocess(
    tmp_path: Path, databases: str, selvedge_dict: str
) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py check`` under settings that differ only in the database set-up."""
    (tmp_path / "check_settings.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa: F403
            DATABASES = {databases}
            SELVEDGE = {{**SELVEDGE, **{selvedge_dict}}}  # noqa: F405
            """
        )
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "check_settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
    }
    env.pop("SELVEDGE_TEST_SUBPROCESS", None)
    return subprocess.run(
        [sys.executable, "-m", "django", "check", "--tag", "selvedge"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_in_memory_sqlite_is_warning_w001(tmp_path: Path) -> None:
    result = _check_in_subprocess(
        tmp_path,
        '{"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}',
        "{}",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output  # a warning does not fail the check command
    assert "selvedge.W001" in output


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql"])
def test_transactional_activities_on_sqlite_are_warning_w003(vendor: str) -> None:
    """The test app registers transactional activities: SQLite warns, PostgreSQL does not."""
    from django.db import connections

    with override_settings(SILENCED_SYSTEM_CHECKS=["selvedge.W007"]):
        if connections["default"].vendor != vendor:
            pytest.skip(f"the test database is not {vendor}")
        messages = selvedge_messages()
    if vendor == "sqlite":
        (message,) = messages
        assert message.id == "selvedge.W003" and not message.is_serious()
        assert "'test.tx_record'" in message.msg and "write lock" in message.msg
        assert "PostgreSQL" in message.hint
    else:
        assert messages == []


def test_no_transactional_activity_no_w003() -> None:
    from selvedge_django import registry

    saved = {name: registry.get_activity(name) for name in registry.registered_activity_names()}
    transactional = [name for name, d in saved.items() if d is not None and d.transactional]
    for name in transactional:
        registry.unregister(name, kind="activity")
    try:
        with override_settings(SILENCED_SYSTEM_CHECKS=["selvedge.W007"]):
            assert selvedge_messages() == []
    finally:
        for name in transactional:
            definition = saved[name]
            assert definition is not None
            registry.register_activity(definition)


@pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3",
    reason="SQLite's busy timeout",
)
def test_a_lease_shorter_than_sqlite_s_busy_timeout_is_warning_w007() -> None:
    """The suite's 4 s lease against the 30 s busy timeout: a renewal may wait longer than
    the lease lives. A TTL of at least the busy timeout draws nothing."""
    with override_settings(SILENCED_SYSTEM_CHECKS=["selvedge.W003"]):
        (message,) = selvedge_messages()
        assert message.id == "selvedge.W007" and not message.is_serious()
        assert "(4 s)" in message.msg and "(30 s)" in message.msg
        assert "timeout" in message.hint
        lease = {"TTL": 30, "RENEW_INTERVAL": 10, "MARGIN": 5, "MAX_SKEW": 1}
        with override_settings(SELVEDGE=selvedge(LEASE=lease)):
            assert selvedge_messages() == []


@pytest.mark.parametrize(
    ("lease", "expected"),
    [
        ({"TTL": 6, "RENEW_INTERVAL": 3.9, "MARGIN": 2, "MAX_SKEW": 0.05}, "renewed every 3.45 s"),
        ({"TTL": 6, "RENEW_INTERVAL": 3.9, "MARGIN": 2, "MAX_SKEW": 3.5}, "only 0.5 s"),
        ({"TTL": 30, "RENEW_INTERVAL": 10, "MARGIN": 5, "MAX_SKEW": 1}, None),
        ({"TTL": 6, "RENEW_INTERVAL": 3.4, "MARGIN": 2, "MAX_SKEW": 0.1}, None),
    ],
    ids=["interval-shortened", "belief-too-short", "defaults", "interval-just-in-time"],
)
def test_a_renewal_interval_the_belief_cannot_wait_for_is_warning_w013(
    lease: dict[str, float], expected: str | None
) -> None:
    """Accepted LEASE settings (E002 refuses only RENEW_INTERVAL + MARGIN >= TTL and
    MARGIN + MAX_SKEW >= TTL) whose interval comes later than half a second before the
    belief ends: the check says what the worker does instead."""
    with override_settings(
        SELVEDGE=selvedge(LEASE=lease),
        SILENCED_SYSTEM_CHECKS=["selvedge.W003", "selvedge.W007"],
    ):
        messages = selvedge_messages()
    if expected is None:
        assert messages == []
        return
    (message,) = messages
    assert message.id == "selvedge.W013" and not message.is_serious()
    assert expected in message.msg and "RENEW_INTERVAL" in message.hint


_PG = '"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db"'
# The renewal checks' set-ups, with the prepared statements a pooler needs off (W011).
_UNPREPARED = '{"PREPARED_STATEMENTS": False}'


@pytest.mark.parametrize(
    ("databases", "selvedge_dict", "expected"),
    [
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "6432", "DISABLE_SERVER_SIDE_CURSORS": True}}}}',
            _UNPREPARED,
            "selvedge.W008",
            id="pooled-without-renewal-database",
        ),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "6432"}}, "direct": {{{_PG}, "PORT": "5432"}}}}',
            '{"LISTEN_DATABASE": "direct", "PREPARED_STATEMENTS": False}',
            "selvedge.W008",
            id="direct-listener-only",
        ),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "6432", "DISABLE_SERVER_SIDE_CURSORS": True}},'
            f' "direct": {{{_PG}, "PORT": "5432"}}}}',
            '{"LISTEN_DATABASE": "direct", "RENEWAL_DATABASE": "direct",'
            ' "PREPARED_STATEMENTS": False}',
            None,
            id="renewals-past-the-pool",
        ),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "6432", "DISABLE_SERVER_SIDE_CURSORS": True}},'
            f' "again": {{{_PG}, "PORT": "6432"}}}}',
            '{"RENEWAL_DATABASE": "again", "PREPARED_STATEMENTS": False}',
            "selvedge.W009",
            id="renewals-through-the-same-pool",
        ),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "6432"}},'
            ' "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": "other.sqlite3"}}',
            '{"RENEWAL_DATABASE": "other", "PREPARED_STATEMENTS": False}',
            "selvedge.E007",
            id="renewals-on-another-database",
        ),
    ],
)
def test_renewal_database_checks(
    tmp_path: Path, databases: str, selvedge_dict: str, expected: str | None
) -> None:
    """W008: a PostgreSQL alias that looks pooled renews through the pool; W009: the
    renewal alias reaches the same host and port; E007: it is another database."""
    result = _check_in_subprocess(tmp_path, databases, selvedge_dict)
    output = result.stdout + result.stderr
    found = set(re.findall(r"selvedge\.[EW]\d{3}", output))
    assert found == ({expected} if expected else set()), output
    assert (result.returncode != 0) == (expected == "selvedge.E007"), output
    if expected == "selvedge.W008":
        assert "RENEWAL_DATABASE" in output and "pool" in output


_POOLED = (
    f'{{"default": {{{_PG}, "PORT": "6432", "DISABLE_SERVER_SIDE_CURSORS": True}},'
    f' "direct": {{{_PG}, "PORT": "5432"}}}}'
)
_PAST_THE_POOL = '"LISTEN_DATABASE": "direct", "RENEWAL_DATABASE": "direct"'


@pytest.mark.parametrize(
    ("databases", "selvedge_dict", "expected"),
    [
        pytest.param(_POOLED, f"{{{_PAST_THE_POOL}}}", "selvedge.W011", id="pooled-prepared"),
        pytest.param(
            _POOLED,
            f'{{{_PAST_THE_POOL}, "PREPARED_STATEMENTS": False}}',
            None,
            id="pooled-unprepared",
        ),
        pytest.param(f'{{"default": {{{_PG}, "PORT": "5432"}}}}', "{}", None, id="direct-prepared"),
        pytest.param(
            f'{{"default": {{{_PG}, "PORT": "6432", "DISABLE_SERVER_SIDE_CURSORS": True,'
            ' "OPTIONS": {"server_side_binding": True, "prepare_threshold": None}},'
            f' "direct": {{{_PG}, "PORT": "5432"}}}}',
            f"{{{_PAST_THE_POOL}}}",
            None,
            id="pooled-options-decide",
        ),
        pytest.param(
            '{"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "app.sqlite3",'
            ' "OPTIONS": {"transaction_mode": "IMMEDIATE"}, "PORT": "6432"}}',
            "{}",
            None,
            id="sqlite",
        ),
    ],
)
def test_prepared_statements_behind_a_pooler_warn_w011(
    tmp_path: Path, databases: str, selvedge_dict: str, expected: str | None
) -> None:
    """W011: the engine prepares its statements (the default) on an alias that looks
    pooled; the warning says to turn PREPARED_STATEMENTS off and when not to."""
    result = _check_in_subprocess(tmp_path, databases, selvedge_dict)
    output = result.stdout + result.stderr
    found = set(re.findall(r"selvedge\.[EW]\d{3}", output))
    assert found == ({expected} if expected else set()), output
    assert result.returncode == 0, output
    if expected:
        assert "PREPARED_STATEMENTS'] = False" in output and "1.21" in output, output


def test_prepared_statements_must_be_a_bool(tmp_path: Path) -> None:
    result = _check_in_subprocess(
        tmp_path,
        '{"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "app.sqlite3"}}',
        '{"PREPARED_STATEMENTS": "yes"}',
    )
    output = result.stdout + result.stderr
    assert "selvedge.E003" in output and "PREPARED_STATEMENTS" in output, output


def test_unsupported_database_is_error_e001(tmp_path: Path) -> None:
    result = _check_in_subprocess(
        tmp_path,
        '{"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "unused.sqlite3"},'
        ' "other": {"ENGINE": "django.db.backends.dummy"}}',
        '{"DATABASE": "other"}',
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "selvedge.E001" in output


# -- SQLite connection set-up ------------------------------------------------------------


only_sqlite = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3",
    reason="SQLite connection set-up",
)


def _sqlite_pragmas(tmp_path: Path, alias: str) -> dict[str, Any]:
    """Open a new SQLite connection under ``alias`` and read the pragmas it was given."""
    from django.db.backends.sqlite3.base import DatabaseWrapper

    wrapper = DatabaseWrapper(
        {**connection_settings(), "NAME": str(tmp_path / f"{alias}.sqlite3")}, alias=alias
    )
    try:
        with wrapper.cursor() as cursor:
            pragmas = {}
            for name in ("synchronous", "journal_mode", "busy_timeout"):
                cursor.execute(f"PRAGMA {name}")
                pragmas[name] = cursor.fetchone()[0]
            return pragmas
    finally:
        wrapper.close()


def connection_settings() -> dict[str, Any]:
    from django.db import connections

    return {**connections["default"].settings_dict, "OPTIONS": {}}


@only_sqlite
@pytest.mark.django_db
def test_sqlite_engine_alias_syncs_every_commit_by_default(tmp_path: Path) -> None:
    pragmas = _sqlite_pragmas(tmp_path, "default")
    assert pragmas == {"synchronous": 2, "journal_mode": "wal", "busy_timeout": 30000}


@only_sqlite
@pytest.mark.django_db
def test_sqlite_synchronous_normal_is_a_setting(tmp_path: Path) -> None:
    with override_settings(SELVEDGE=selvedge(SQLITE_SYNCHRONOUS="NORMAL")):
        assert _sqlite_pragmas(tmp_path, "default")["synchronous"] == 1


@only_sqlite
@pytest.mark.django_db
def test_sqlite_aliases_the_engine_does_not_use_are_left_alone(tmp_path: Path) -> None:
    # SQLite's own defaults (a rollback journal, FULL) and Python's 5 s busy timeout.
    pragmas = _sqlite_pragmas(tmp_path, "reports")
    assert pragmas == {"synchronous": 2, "journal_mode": "delete", "busy_timeout": 5000}


@pytest.mark.parametrize("value", ["OFF", "normal ", 1, None])
def test_sqlite_synchronous_must_be_full_or_normal(value: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="SQLITE_SYNCHRONOUS"):
        conf.resolve_settings({"SQLITE_SYNCHRONOUS": value})


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ("{}", True),
        ('{"transaction_mode": "DEFERRED"}', True),
        ('{"transaction_mode": "IMMEDIATE"}', False),
        ('{"transaction_mode": "EXCLUSIVE"}', False),
    ],
)
def test_sqlite_without_immediate_transactions_is_warning_w002(
    tmp_path: Path, options: str, warned: bool
) -> None:
    databases = (
        '{"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "unused.sqlite3"},'
        ' "engine": {"ENGINE": "django.db.backends.sqlite3", "NAME": "engine.sqlite3",'
        f' "OPTIONS": {options}}}}}'
    )
    result = _check_in_subprocess(tmp_path, databases, '{"DATABASE": "engine"}')
    output = result.stdout + result.stderr
    assert result.returncode == 0, output  # a warning does not fail the check command
    assert ("selvedge.W002" in output) is warned, output
    if warned:
        assert "'engine'" in output and "IMMEDIATE" in output
    # Only the alias the engine uses is checked ("default" has no transaction_mode).
    assert output.count("selvedge.W002") == (1 if warned else 0), output


def test_postgresql_without_autovacuum_is_warning_w006(tdb: None) -> None:
    """A database check (``migrate``, ``check --database``): plain checks never query.

    The server's setting is read, never changed: the suite's two PostgreSQL passes
    share one server, and autovacuum's statistics would move the plan tests' plans.
    """
    from django.core.checks import run_checks
    from django.db import connection

    assert [m for m in run_checks() if m.id == "selvedge.W006"] == []
    found = [m for m in run_checks(databases=["default"]) if m.id == "selvedge.W006"]
    if connection.vendor != "postgresql":
        assert found == []
        return
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        configured = cursor.fetchone()[0]
    if configured == "on":
        assert found == []
    else:
        (message,) = found
        assert f"autovacuum is {configured}" in message.msg and not message.is_serious()
        assert "VACUUM ANALYZE" in message.hint
