"""System checks with stable ids: ``selvedge.E001`` ... and ``selvedge.W001`` ..."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from . import exceptions as exc
from .conf import (
    SelvedgeSettings,
    lease_problems,
    rate_limit_problems,
    resolve_settings,
    workflow_cache_problems,
)


@register("selvedge")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate SELVEDGE, the lease timing and the database behind it."""
    messages: list[CheckMessage] = []
    raw = getattr(settings, "SELVEDGE", None) or {}
    lease = raw.get("LEASE") if isinstance(raw, dict) else None
    if isinstance(lease, dict):
        for problem in lease_problems(lease):
            messages.append(
                Error(
                    f"Unsafe SELVEDGE['LEASE']: {problem}.",
                    hint="Keep RENEW_INTERVAL + MARGIN and MARGIN + MAX_SKEW below TTL.",
                    id="selvedge.E002",
                )
            )
    cache = raw.get("WORKFLOW_CACHE") if isinstance(raw, dict) else None
    if cache is not None:
        for problem in workflow_cache_problems(cache):
            messages.append(
                Error(
                    f"Invalid SELVEDGE['WORKFLOW_CACHE']: {problem}.",
                    hint="MAX_ENTRIES from 0 (no cache) to 10000, MAX_BYTES a positive integer,"
                    " STICKY_WINDOW from 0 to 60 seconds.",
                    id="selvedge.E005",
                )
            )
    limits = raw.get("QUEUE_RATE_LIMITS") if isinstance(raw, dict) else None
    if limits:
        for problem in rate_limit_problems(limits):
            messages.append(
                Error(
                    f"Invalid SELVEDGE['QUEUE_RATE_LIMITS']: {problem}.",
                    hint='Give each queue a rate such as "100/m" (per second: /s, per hour: /h).',
                    id="selvedge.E006",
                )
            )
    if isinstance(raw, dict):
        messages += _payload_codec_problems(raw)
    if messages:
        return messages
    try:
        resolved = resolve_settings(raw)
    except ImproperlyConfigured as error:
        return [Error(str(error), hint="See the configuration reference.", id="selvedge.E003")]
    compatible = resolved.compatible_versions
    if compatible is not None and resolved.code_version not in compatible:
        messages.append(
            Warning(
                f"SELVEDGE['CODE_VERSION'] ({resolved.code_version!r}) is not in "
                f"SELVEDGE['COMPATIBLE_VERSIONS'] {list(compatible)!r}: the workers of this "
                "process do not run the instances it starts.",
                hint="Add CODE_VERSION to COMPATIBLE_VERSIONS, unless this process only "
                "drains older versions.",
                id="selvedge.W005",
            )
        )
    from .storage import database_checks, store_class

    store = store_class(resolved.database)
    if store is None:
        messages.append(
            Error(
                f"Database {resolved.database!r} is {connections[resolved.database].vendor}; "
                "selvedge_django supports SQLite and PostgreSQL.",
                hint="Point SELVEDGE['DATABASE'] at a SQLite or PostgreSQL alias.",
                id="selvedge.E001",
            )
        )
        return messages
    messages += _lease_renewals_keep_up(resolved)
    messages += database_checks(resolved.database)
    messages += _renewal_database(resolved, store)
    messages += _read_database(resolved, store)
    messages += _prepared_behind_a_pooler(resolved, store)
    if store.single_writer:
        messages += _transactional_on_single_writer(resolved.database)
        messages += _lease_within_busy_timeout(resolved)
    return messages


def _payload_codec_problems(raw: dict[str, Any]) -> list[CheckMessage]:
    """selvedge.E008 (a payload codec without keys) and selvedge.E009 (keys that are not
    keys of the codec, such as a Fernet key mistyped)."""
    codec = raw.get("PAYLOAD_CODEC")
    keys = raw.get("PAYLOAD_KEYS")
    if codec is None:
        if keys:
            return [
                Warning(
                    "SELVEDGE['PAYLOAD_KEYS'] is set but SELVEDGE['PAYLOAD_CODEC'] is not: new "
                    "values are stored as plain JSON (the keys only decrypt values stored "
                    "while a codec was on).",
                    hint="Set PAYLOAD_CODEC = 'selvedge_django.codecs.FernetCodec' to encrypt; "
                    "silence with SILENCED_SYSTEM_CHECKS = ['selvedge.W010'] while turning "
                    "it off.",
                    id="selvedge.W010",
                )
            ]
        return []
    if not isinstance(codec, str | type):
        return []  # an instance: built with its keys already
    if keys is None or (not callable(keys) and not keys):
        return [
            Error(
                f"SELVEDGE['PAYLOAD_CODEC'] is {codec!r} but SELVEDGE['PAYLOAD_KEYS'] is empty: "
                "nothing could be encrypted or decrypted.",
                hint="Set PAYLOAD_KEYS to a list of keys (the first encrypts, all decrypt), "
                "e.g. [FernetCodec.generate_key()] kept in your secrets, or a callable "
                "returning it.",
                id="selvedge.E008",
            )
        ]
    from .codecs import resolve_payload_codec

    try:
        resolve_payload_codec(codec, keys)
    except ImproperlyConfigured as error:
        return [
            Error(
                f"Invalid SELVEDGE['PAYLOAD_KEYS']: {error}",
                hint="Each key must be a key of the codec: for FernetCodec, 32 bytes in "
                "URL-safe base64 (44 characters), as FernetCodec.generate_key() makes.",
                id="selvedge.E009",
            )
        ]
    return []


def _lease_renewals_keep_up(resolved: SelvedgeSettings) -> list[CheckMessage]:
    """selvedge.W013: RENEW_INTERVAL too close to the lease's belief (it is shortened), or a
    belief too short for the renewer to keep the lease trusted between its ticks."""
    lease = resolved.lease
    every = lease.renew_every
    if lease.renew_interval <= every:
        return []
    if lease.belief < 3 * lease.renewer_tick:
        what = (
            f"a holder trusts its lease for only {lease.belief:g} s after each renewal "
            f"(TTL - MARGIN - MAX_SKEW), too little for renewals every {lease.renewer_tick:g} s "
            "at best to keep it trusted: executions are abandoned with LeaseLost and run again."
        )
    else:
        what = (
            f"leases are renewed every {every:g} s, not every {lease.renew_interval:g} s: a "
            f"holder trusts its lease for {lease.belief:g} s after each renewal "
            f"(TTL - MARGIN - MAX_SKEW), and a renewal is due {lease.renewal_lead:g} s before "
            "that ends."
        )
    return [
        Warning(
            f"SELVEDGE['LEASE']: {what}",
            hint=f"Keep RENEW_INTERVAL at most TTL - MARGIN - MAX_SKEW - {lease.renewal_lead:g} "
            "s (a third of TTL is usual), or raise TTL.",
            id="selvedge.W013",
        )
    ]


def _lease_within_busy_timeout(resolved: SelvedgeSettings) -> list[CheckMessage]:
    """selvedge.W007: a renewal may wait for SQLite's write lock longer than a lease lives."""
    from .storage.sqlite.turns import busy_timeout

    alias = resolved.renewal_database or resolved.database
    timeout = busy_timeout(connections[alias])
    ttl = resolved.lease.ttl
    if ttl >= timeout:
        return []
    return [
        Warning(
            f"SELVEDGE['LEASE']['TTL'] ({ttl:g} s) is shorter than the busy timeout of the "
            f"SQLite database {alias!r} ({timeout:g} s): a renewal waiting for the write lock "
            "behind another process's write transaction may wait past the TTL, so a healthy "
            "worker's leases and claims lapse (activities run again, and each lapse uses one "
            "of the activity's attempts).",
            hint=f"Raise LEASE['TTL'] to at least {timeout:g} s, or lower "
            f"DATABASES[{alias!r}]['OPTIONS']['timeout'] below the TTL (a renewal that gives "
            "up is tried again at once), and keep write transactions short.",
            id="selvedge.W007",
        )
    ]


def _renewal_database(resolved: SelvedgeSettings, store: type[Any]) -> list[CheckMessage]:
    """selvedge.E007 (RENEWAL_DATABASE is another database), selvedge.W008 (renewals
    through what looks like a transaction pooler) and selvedge.W009 (a RENEWAL_DATABASE
    that reaches the server the same way as DATABASE)."""
    main = connections[resolved.database]
    renewal = resolved.renewal_database
    if renewal is None or renewal == resolved.database:
        looks_pooled = bool(main.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")) or (
            resolved.listen_database not in (None, resolved.database)
        )
        if store.single_writer or not looks_pooled:  # SQLite: no pooler
            return []
        return [
            Warning(
                f"The selvedge database {resolved.database!r} looks like it goes through a "
                "connection pooler (DISABLE_SERVER_SIDE_CURSORS, or a separate "
                "LISTEN_DATABASE), and leases and claims are renewed through it: in "
                "transaction mode, renewals wait in the pool's queue behind the worker's own "
                "transactions (a transactional activity holds a server connection for its "
                "whole body), and a healthy worker's leases and claims lapse when that wait "
                "passes LEASE['TTL'].",
                hint="Set SELVEDGE['RENEWAL_DATABASE'] to an alias of the same database that "
                "connects to PostgreSQL directly (the LISTEN_DATABASE alias will do); see "
                "'pgbouncer in transaction mode' in docs/deployment.md. Silence with "
                "SILENCED_SYSTEM_CHECKS = ['selvedge.W008'] when there is no pooler.",
                id="selvedge.W008",
            )
        ]
    from .storage import store_class

    other = connections[renewal]
    if store_class(renewal) is not store or (
        store.single_writer and other.settings_dict.get("NAME") != main.settings_dict.get("NAME")
    ):
        return [
            Error(
                f"SELVEDGE['RENEWAL_DATABASE'] {renewal!r} is not the database of "
                f"SELVEDGE['DATABASE'] {resolved.database!r}: renewals there would find none "
                "of the worker's leases and claims.",
                hint="Point RENEWAL_DATABASE at an alias of the same database (on PostgreSQL, "
                "a direct connection to the server that DATABASE reaches through a pooler).",
                id="selvedge.E007",
            )
        ]
    if not store.single_writer and _endpoint(other) == _endpoint(main):
        return [
            Warning(
                f"SELVEDGE['RENEWAL_DATABASE'] {renewal!r} connects to the same host and port "
                f"as SELVEDGE['DATABASE'] {resolved.database!r}: if that is a pooler, renewals "
                "still wait in its queue behind the worker's own transactions.",
                hint="Give RENEWAL_DATABASE PostgreSQL's own host and port, past the pooler.",
                id="selvedge.W009",
            )
        ]
    return []


def _read_database(resolved: SelvedgeSettings, store: type[Any]) -> list[CheckMessage]:
    """selvedge.E010 (READ_DATABASE is not a copy of the engine's database: another kind
    of database, or another SQLite file) and selvedge.W012 (ATOMIC_REQUESTS on the
    engine's database keeps every request's reads there)."""
    read = resolved.read_database
    if read is None or read == resolved.database:
        return []
    from .storage import store_class

    main, other = connections[resolved.database], connections[read]
    # A NAME may be a Path on one alias and a string on the other.
    same_file = str(other.settings_dict.get("NAME")) == str(main.settings_dict.get("NAME"))
    if store_class(read) is not store or (store.single_writer and not same_file):
        return [
            Error(
                f"SELVEDGE['READ_DATABASE'] {read!r} ({other.vendor}, "
                f"{other.settings_dict.get('NAME')!r}) is not a copy of SELVEDGE['DATABASE'] "
                f"{resolved.database!r} ({main.vendor}, {main.settings_dict.get('NAME')!r}): "
                "the admin, status, find_instances, exports and queries would read rows the "
                "engine never wrote.",
                hint="Point READ_DATABASE at a read replica of the engine's database (on "
                "PostgreSQL, a streaming replica's host; on SQLite, the same file), or "
                "remove it to read the engine's database.",
                id="selvedge.E010",
            )
        ]
    if main.settings_dict.get("ATOMIC_REQUESTS"):
        return [
            Warning(
                f"SELVEDGE['READ_DATABASE'] is {read!r}, but the engine's database "
                f"{resolved.database!r} has ATOMIC_REQUESTS: every request runs in a "
                "transaction there, and a read inside one must see its writes, so the "
                "admin and the views never read the replica.",
                hint="Turn ATOMIC_REQUESTS off for that alias (wrap the views that need it "
                "in transaction.atomic()), or silence with SILENCED_SYSTEM_CHECKS = "
                "['selvedge.W012'] if only commands and scripts should read the replica.",
                id="selvedge.W012",
            )
        ]
    return []


def _prepared_behind_a_pooler(resolved: SelvedgeSettings, store: type[Any]) -> list[CheckMessage]:
    """selvedge.W011: the engine prepares its statements (PREPARED_STATEMENTS, the
    default) on a PostgreSQL alias that looks like it goes through a pooler."""
    if store.single_writer or not resolved.prepared_statements:
        return []
    main = connections[resolved.database]
    settings_dict = main.settings_dict
    options = settings_dict.get("OPTIONS") or {}
    if options.get("server_side_binding") or "prepare_threshold" in options:
        return []  # the project's own OPTIONS decide what is prepared
    signs = []
    if settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        signs.append("DISABLE_SERVER_SIDE_CURSORS")
    for key in ("LISTEN_DATABASE", "RENEWAL_DATABASE"):
        if getattr(resolved, key.lower()) not in (None, resolved.database):
            signs.append(f"a separate {key}")
    if str(settings_dict.get("PORT") or "") == "6432":
        signs.append("port 6432, pgbouncer's")
    if not signs:
        return []
    return [
        Warning(
            f"The selvedge database {resolved.database!r} looks like it goes through a "
            f"connection pooler ({', '.join(signs)}), and the engine prepares its own "
            "statements on it (SELVEDGE['PREPARED_STATEMENTS'], on by default). A pooler in "
            "transaction mode that cannot keep prepared statements (pgbouncer before 1.21, "
            "or later with max_prepared_statements = 0) runs each transaction in any "
            "server session, where a statement prepared in another one is missing: the "
            "engine's statements then fail with PreparedStatementError.",
            hint="Behind such a pooler set SELVEDGE['PREPARED_STATEMENTS'] = False. With "
            "pgbouncer 1.21 or later and max_prepared_statements above 0, a pooler in "
            "session mode, or no pooler, keep them (they save a parse and a plan per "
            "statement) and silence with SILENCED_SYSTEM_CHECKS = ['selvedge.W011']; see "
            "'pgbouncer in transaction mode' in docs/deployment.md.",
            id="selvedge.W011",
        )
    ]


def _endpoint(conn: Any) -> tuple[str, str]:
    settings_dict = conn.settings_dict
    return str(settings_dict.get("HOST") or ""), str(settings_dict.get("PORT") or "")


def _transactional_on_single_writer(alias: str) -> list[CheckMessage]:
    """selvedge.W003: transactional activities hold SQLite's write lock for their whole body."""
    from .registry import get_activity, registered_activity_names

    names = [
        name
        for name in registered_activity_names()
        if (definition := get_activity(name)) is not None and definition.transactional
    ]
    if not names:
        return []
    shown = ", ".join(repr(name) for name in names[:5]) + (" ..." if len(names) > 5 else "")
    return [
        Warning(
            f"Transactional activities ({shown}) run on the SQLite database {alias!r}: each "
            "attempt holds the database's write lock for its whole body, so every other "
            "writer (a web request's sv.signal(), the worker's lease renewals) waits until it "
            "commits, or fails with 'database is locked' after the busy timeout.",
            hint="Keep their bodies to a few seconds (well under LEASE['TTL'] - "
            "LEASE['RENEW_INTERVAL'] and the busy timeout), make them non-transactional, or "
            "use PostgreSQL. Silence with SILENCED_SYSTEM_CHECKS = ['selvedge.W003'].",
            id="selvedge.W003",
        )
    ]


@register("selvedge")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate SELVEDGE["SCHEDULES"]: each definition, and that its workflow is registered."""
    raw = getattr(settings, "SELVEDGE", None) or {}
    schedules = raw.get("SCHEDULES") if isinstance(raw, dict) else None
    if not schedules or not isinstance(schedules, dict):
        return []  # absent, or reported by check_settings (E003)
    from .registry import get_workflow
    from .schedules import code_schedules

    messages: list[CheckMessage] = []
    for name, entry in schedules.items():
        try:
            (columns,) = code_schedules({name: entry}).values()
        except exc.InvalidSchedule as error:
            messages.append(
                Error(
                    str(error),
                    hint="See 'Schedules' in docs/api.md for the keys and their values.",
                    id="selvedge.E004",
                )
            )
            continue
        if get_workflow(columns["workflow_name"]) is None:
            messages.append(
                Warning(
                    f"SELVEDGE['SCHEDULES'][{name!r}] starts workflow "
                    f"{columns['workflow_name']!r}, which is not registered in this process.",
                    hint="Workers that do not register it leave its runs to workers that do.",
                    id="selvedge.W004",
                )
            )
    return messages


@register(Tags.database)
def check_database_server(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """selvedge.W006 (PostgreSQL without autovacuum): run where Django runs its database
    checks (``migrate``, ``check --database``), as it queries the server."""
    try:
        resolved = resolve_settings(getattr(settings, "SELVEDGE", None))
    except ImproperlyConfigured:
        return []  # reported by check_settings (E003)
    if not databases or resolved.database not in databases:
        return []
    from .storage import server_checks

    try:
        return server_checks(resolved.database)
    except DatabaseError:
        return []  # an unreachable server is for migrate itself to report


@register("selvedge")
def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run SelvedgeBackend's checks where nothing else does.

    Django 6 checks every ``TASKS`` backend itself; the django-tasks backport does so
    only when its ``django_tasks`` app is installed, so without it these run here.
    """
    if not getattr(settings, "TASKS", None) or "django_tasks" in settings.INSTALLED_APPS:
        return []
    try:
        from .tasks import SelvedgeBackend, compat
    except ImportError:
        return []
    if compat.FRAMEWORK != "django_tasks":
        return []
    messages: list[CheckMessage] = []
    for backend in compat.task_backends.all():
        if isinstance(backend, SelvedgeBackend):
            messages.extend(backend.check())
    return messages
