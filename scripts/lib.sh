# Shell functions shared by scripts/test, scripts/demo and .ci/run (sourced, not executed).
#
# Settings read from the environment:
#   SELVEDGE_VENV     virtualenv folder (default: .venv in the repository root)
#   SELVEDGE_PYTHON   interpreter that creates it (default: python3)
#   SELVEDGE_DJANGO   extra requirement installed with the project, e.g. 'Django>=6.0,<6.1'
#   SELVEDGE_PG_HOST / _PORT / _USER / _PASSWORD / _NAME   PostgreSQL for the tests

SV_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

sv_log() {
    printf '==> %s\n' "$*"
}

sv_die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Print the absolute path of the virtualenv folder.
sv_venv_dir() {
    local venv="${SELVEDGE_VENV:-.venv}"
    case "$venv" in
        /*) printf '%s\n' "$venv" ;;
        *) printf '%s\n' "$SV_ROOT/$venv" ;;
    esac
}

# Run the virtualenv's pip, dropping the warnings about missing local
# index folders that some machines' pip configuration produces.
sv_pip() {
    local venv="$1"
    shift
    "$venv/bin/python" -m pip --disable-pip-version-check "$@" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

# Create the virtualenv if missing, install the project with its dev group, and
# put the virtualenv first on PATH. Installing is skipped when nothing it depends
# on changed since the last successful install.
sv_setup_venv() {
    local venv python extra stamp want
    venv="$(sv_venv_dir)"
    python="${SELVEDGE_PYTHON:-python3}"
    extra="${SELVEDGE_DJANGO:-}"
    command -v "$python" >/dev/null 2>&1 || sv_die "$python not found"
    if [ ! -x "$venv/bin/python" ]; then
        sv_log "creating $(basename "$venv") with $python ($("$python" --version 2>&1))"
        "$python" -m venv "$venv" || sv_die "could not create the virtualenv $venv"
    fi
    stamp="$venv/.selvedge-install"
    want="$(
        {
            printf '%s\n' "$SV_ROOT" "$extra"
            "$venv/bin/python" --version 2>&1
            cat "$SV_ROOT/pyproject.toml"
        } | cksum
    )"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
        && "$venv/bin/python" -I - "$SV_ROOT" >/dev/null 2>&1 <<'PY'; then
import importlib.util, os, sys
spec = importlib.util.find_spec("selvedge_django")  # finds it without importing it
assert spec is not None and spec.origin is not None
assert os.path.realpath(spec.origin).startswith(os.path.realpath(sys.argv[1]) + os.sep)
for name in ("django", "pytest", "psycopg", "environ", "ruff", "mypy"):
    assert importlib.util.find_spec(name) is not None, name
PY
        sv_log "$(basename "$venv") is up to date"
    else
        sv_log "installing selvedge_django (editable) and the dev group into $(basename "$venv")"
        # --group needs pip 25.1 or newer.
        sv_pip "$venv" install --quiet 'pip>=25.1' || sv_die "could not upgrade pip"
        local args=(-e "$SV_ROOT[postgres]" --group "$SV_ROOT/pyproject.toml:dev")
        [ -n "$extra" ] && args+=("$extra")
        sv_pip "$venv" install --quiet "${args[@]}" || sv_die "pip install failed"
        printf '%s\n' "$want" >"$stamp"
    fi
    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"
    hash -r
}

# Make sure PostgreSQL answers on SELVEDGE_PG_HOST:PORT (starting the local
# cluster when it is down) and that the database the tests connect to exists.
sv_ensure_postgres() {
    local host="${SELVEDGE_PG_HOST:-127.0.0.1}" port="${SELVEDGE_PG_PORT:-5432}"
    local i
    if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h "$host" -p "$port"; then
        if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
            local version
            version="$(ls /etc/postgresql | sort -V | tail -n 1)"
            sv_log "starting PostgreSQL $version"
            pg_ctlcluster --skip-systemctl-redirect "$version" main start \
                || sv_log "pg_ctlcluster could not start the cluster"
        fi
        for i in $(seq 1 60); do
            pg_isready -q -h "$host" -p "$port" && break
            sleep 0.5
        done
        pg_isready -q -h "$host" -p "$port" || sv_die "PostgreSQL is not accepting connections on $host:$port"
    fi
    python - <<'PY' || sv_die "could not reach PostgreSQL or create the test database"
import os
import time

import psycopg
from psycopg import sql

params = {
    "host": os.environ.get("SELVEDGE_PG_HOST", "127.0.0.1"),
    "port": os.environ.get("SELVEDGE_PG_PORT", "5432"),
    "user": os.environ.get("SELVEDGE_PG_USER", "postgres"),
    "password": os.environ.get("SELVEDGE_PG_PASSWORD", "") or None,
    "dbname": "postgres",
    "connect_timeout": 5,
}
name = os.environ.get("SELVEDGE_PG_NAME", "selvedge")
deadline = time.monotonic() + 30
while True:
    try:
        conn = psycopg.connect(autocommit=True, **params)
        break
    except psycopg.OperationalError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
with conn:
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    if not exists:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"==> created database {name}", flush=True)
PY
}
