#!/usr/bin/env bash
# The README's test command (`make test`): installs the project into .venv, runs ruff,
# mypy and makemigrations --check, `make demo` on the oldest and newest Python, then the
# test matrix through nox (noxfile.py) as a diagonal: every test once per database
# (SQLite and MariaDB/MySQL on Python 3.13 + Django 6.1, PostgreSQL on Python 3.11 +
# Django 5.2), the tests without worker processes on the other corner, the fresh projects
# built from the wheel on both corners, the smoke suite on every other Python x Django
# cell, the Galera suite, the scale suite (many hosts, private servers), and the coverage
# of django_dbqueue/ over the full runs and the two suites (the other runs repeat parts
# of the full runs on other cells, without coverage: noxfile.pytest).
# A server that cannot be reached is a loud failure under CI=true, and a loud skip of
# that database's runs otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
LINT_ONLY=0
[[ "${1:-}" == "--lint-only" ]] && LINT_ONLY=1 && shift
DATABASES=${DBQUEUE_TEST_DATABASES:-"sqlite mysql postgres"}

say() { printf '\n==> %s\n' "$*"; }
loud() { printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n!!! %s\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' "$*" >&2; }

# mysqlclient compiles against MariaDB's client library.
if ! pkg-config --exists libmariadb 2>/dev/null && ! pkg-config --exists mysqlclient 2>/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        say "Installing libmariadb-dev and pkg-config (needed to build mysqlclient)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmariadb-dev pkg-config >/dev/null
    else
        loud "libmariadb-dev and pkg-config are missing: install them (apt-get install libmariadb-dev pkg-config)"
        exit 1
    fi
fi

# The Galera suite runs Debian's MariaDB server with the Galera provider, and rsync for
# the state transfers between its nodes; the clock-skew tests run workers under faketime;
# the pooler tests (PostgreSQL run) start Debian's pgbouncer (in /usr/sbin).
have_pgbouncer() { command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]]; }
if [[ ! -e /usr/lib/galera/libgalera_smm.so ]] || ! command -v rsync >/dev/null || ! command -v faketime >/dev/null || ! have_pgbouncer; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        say "Installing galera-4, rsync, faketime and pgbouncer (the Galera suite, the clock-skew and pooler tests)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 rsync faketime pgbouncer >/dev/null
    fi
    if [[ ! -e /usr/lib/galera/libgalera_smm.so ]] || ! command -v rsync >/dev/null || ! command -v faketime >/dev/null || ! have_pgbouncer; then
        loud "galera-4, rsync, faketime or pgbouncer is missing and could not be installed: the Galera suite, the clock-skew or the pooler tests will fail"
        if [[ "${CI:-}" == "true" ]]; then exit 1; fi
    fi
fi

# The admin's browser tests drive Debian's Chromium through Playwright.
if ! command -v chromium >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        say "Installing chromium (the admin's browser tests run it headless)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
    if ! command -v chromium >/dev/null; then
        loud "chromium is missing and could not be installed (apt-get install chromium): the browser tests will fail"
        if [[ "${CI:-}" == "true" ]]; then exit 1; fi
    fi
fi

stamp="$VENV/.test-installed"
if [[ ! -x "$PY" || ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
    say "Installing django-dbqueue with its test dependencies into $VENV"
    "$PYTHON" -m venv "$VENV" || exit 1
    "$PY" -m pip install -q --upgrade pip || exit 1
    "$PY" -m pip install -q -e '.[mysql,postgres,redis,tasks,dev]' || exit 1
    touch "$stamp"
fi

status=0
say "ruff"
"$VENV/bin/ruff" check django_dbqueue testproject tests noxfile.py || status=1
say "mypy (django-stubs)"
"$VENV/bin/mypy" django_dbqueue || status=1
say "makemigrations --check"
DBQUEUE_DB=sqlite "$PY" manage.py makemigrations --check --dry-run || status=1
if [[ $LINT_ONLY == 1 ]]; then exit $status; fi

# The newest interpreter of a minor version: python3.X on PATH, else pyenv's.
find_python() {
    local found
    found=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1)
    if [[ -n "$found" ]]; then echo "$found"; else command -v "python$1"; fi
}

# The README's first command, in a virtualenv of its own with no extras installed, as a
# user on a fresh clone would run it: on Python 3.11 (Django 5.2, no django-tasks
# backport) and on Python 3.13 (the newest Django).
for minor in 3.11 3.13; do
    python=$(find_python $minor)
    say "make demo on Python $minor (SQLite, base install only)"
    if [[ -z "$python" ]]; then
        loud "Python $minor is not installed: make demo cannot run on it"
        status=1
        continue
    fi
    if demo_out=$(make demo PYTHON="$python" VENV=".venv-demo-$minor" 2>&1); then
        if ! grep -q "Finished: 5000 done, 1 failed" <<<"$demo_out"; then
            printf '%s\n' "$demo_out" | tail -20
            loud "make demo on Python $minor ran but did not report 5000 done and 1 failed"
            status=1
        else
            grep "Finished:" <<<"$demo_out"
        fi
    else
        printf '%s\n' "$demo_out" | tail -20
        loud "make demo failed on Python $minor"
        status=1
    fi
done

server_up() {
    case "$1" in
        sqlite) return 0 ;;
        mysql) "$PY" -c "import MySQLdb; MySQLdb.connect(host='${MYSQL_HOST:-127.0.0.1}', port=int('${MYSQL_PORT:-3306}'), user='${MYSQL_USER:-root}', passwd='${MYSQL_PASSWORD:-}', connect_timeout=3)" 2>/dev/null ;;
        postgres) "$PY" -c "import psycopg; psycopg.connect(host='${PGHOST:-127.0.0.1}', port='${PGPORT:-5432}', user='${PGUSER:-postgres}', dbname='postgres', connect_timeout=3)" 2>/dev/null ;;
        redis) "$PY" -c "import redis, os; redis.Redis.from_url(os.environ.get('DBQUEUE_REDIS_URL', 'redis://127.0.0.1:6379/0'), socket_connect_timeout=3).ping()" 2>/dev/null ;;
    esac
}

if ! server_up redis; then
    loud "Redis is not reachable at ${DBQUEUE_REDIS_URL:-redis://127.0.0.1:6379/0}: the Redis lock tests cannot run"
    if [[ "${CI:-}" == "true" ]]; then status=1; fi
fi

reachable=""
for db in $DATABASES; do
    if server_up "$db"; then
        reachable="$reachable $db"
    else
        loud "The $db server is not reachable: its test runs are SKIPPED${CI:+ and, under CI, that is a failure}"
        if [[ "${CI:-}" == "true" ]]; then status=1; fi
    fi
done

mkdir -p test-results
rm -f test-results/*.xml test-results/*.log
rm -rf .coverage-data
# The matrix (noxfile.py) as a diagonal in three streams side by side. Each step of a
# stream is one nox call (the databases of its runs, then its sessions); every session
# has its own test databases and Redis key prefix, and all runs on the shared MariaDB are
# in one stream (GET_LOCK names are server-wide). Every test runs in full once per
# database (SQLite and MariaDB at the newest corner, PostgreSQL at the oldest), the
# tests without worker processes (`stack`) on the other corner, the fresh projects from
# the wheel at both corners, the smoke suite on every other cell. The tests that restart
# a server run last, alone.
read -r old_corner new_corner <<<"$("$VENV/bin/python" -c "import noxfile; print(' '.join(f'full({p}-django{d})' for p, d in noxfile.CORNERS))")"
read -r -a everything <<<"$("$VENV/bin/python" -c "import noxfile; print(' '.join(noxfile.nox.options.sessions))")"
smoke_cells=()
for session in "${everything[@]}"; do [[ $session == smoke* ]] && smoke_cells+=("$session"); done
stack_sessions=("${new_corner/full/stack}" "${old_corner/full/stack}")
fresh_old="${old_corner/full/fresh}"
STREAMS=(one two three)
# PostgreSQL's full run is the longest (28 minutes in the last CI simulation): the
# SQLite stack run goes after the SQLite full run instead (stream one took 40 minutes
# with it, stream three 30 without). The MariaDB and PostgreSQL full and stack runs leave
# the clock-skew, PgBouncer and replica tests to the scale session, which runs them on its
# own servers (DBQUEUE_TEST_LEAVE_TO_SCALE; 3-4 minutes of the two longest streams).
STREAM_one=("postgres:$old_corner" "postgres:${stack_sessions[0]}" "sqlite:$fresh_old")
STREAM_two=("mysql:$new_corner" "mysql:${stack_sessions[1]}" "sqlite:${smoke_cells[*]}")
# The Galera suite starts a 3-node cluster of its own (ports 3321-3323 and 4601-4623);
# the scale suite a MariaDB, a PostgreSQL, a PgBouncer and a replica pair of its own
# (ports 3330-3334): 3.7-4.2 minutes alone at load 3-6, in this stream's slack.
STREAM_three=("sqlite:$new_corner" "mysql:galera" "sqlite:${stack_sessions[1]}" "mysql:scale")

posargs=("$@")
run_stream() {  # name, steps ("databases:sessions"); a database that is not reachable is left out
    local name=$1 step dbs sessions db wanted status=0
    shift
    for step in "$@"; do
        dbs=${step%%:*}
        read -r -a sessions <<<"${step#*:}"
        wanted=""
        for db in $dbs; do [[ " $reachable " == *" $db "* ]] && wanted="$wanted $db"; done
        [[ -z "${wanted// /}" ]] && continue
        echo "== $name: DBQUEUE_TEST_DATABASES=\"${wanted# }\" nox -R -s ${sessions[*]}"
        DBQUEUE_TEST_DATABASES="$wanted" DBQUEUE_TEST_RESTARTS=without DBQUEUE_TEST_LEAVE_TO_SCALE=1 \
            "$VENV/bin/nox" -R -s "${sessions[@]}" -- "${posargs[@]}" || status=1
    done
    return $status
}

if [[ -n "${reachable// /}" ]]; then
    say "Test virtualenvs (nox --install-only): ${everything[*]} ${stack_sessions[*]} $fresh_old galera scale"
    "$VENV/bin/nox" --install-only -s "${everything[@]}" "${stack_sessions[@]}" "$fresh_old" galera scale >test-results/nox-install.log 2>&1 \
        || { tail -30 test-results/nox-install.log; loud "could not build the test virtualenvs"; exit 1; }

    say "The test matrix (nox), ${#STREAMS[@]} streams: test-results/stream-*.log"
    pids=()
    for name in "${STREAMS[@]}"; do
        steps="STREAM_$name[@]"
        run_stream "$name" "${!steps}" >"test-results/stream-$name.log" 2>&1 &
        pids+=($!)
    done
    started=$SECONDS
    while jobs -r | grep -q .; do
        sleep 60
        for name in "${STREAMS[@]}"; do
            log="test-results/stream-$name.log"
            printf '    %3d min  %-18s %s\n' $(((SECONDS - started) / 60)) "${log#test-results/}" \
                "$(grep -E '^nox > Running session|[0-9]+ (passed|failed)' "$log" | tail -1 | cut -c1-90)"
        done
    done
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    for name in "${STREAMS[@]}"; do
        say "test-results/stream-$name.log ($((SECONDS - started)) s since the streams started)"
        cat "test-results/stream-$name.log"
    done

    # On the corner where each server runs in full: PostgreSQL at the oldest, MariaDB at
    # the newest.
    for step in "postgres:$old_corner" "mysql:$new_corner"; do
        db=${step%%:*}
        [[ " $reachable " == *" $db "* ]] || continue
        say "The tests that restart the $db server (alone)"
        DBQUEUE_TEST_DATABASES="$db" DBQUEUE_TEST_RESTARTS=only \
            "$VENV/bin/nox" -R -s "${step#*:}" -- "$@" || status=1
    done
fi

say "Coverage of django_dbqueue/ (every run and the worker processes they started)"
if "$VENV/bin/coverage" combine -q --data-file=.coverage-data/.coverage .coverage-data/ 2>/dev/null; then
    "$VENV/bin/coverage" report --data-file=.coverage-data/.coverage >test-results/coverage.txt
    grep -E "^(Name|TOTAL)" test-results/coverage.txt
    echo "(per module: test-results/coverage.txt; lines, not branches: setup.cfg; .venv/bin/coverage html --data-file=.coverage-data/.coverage for a browsable report)"
else
    loud "no coverage data was written"
    status=1
fi

"$PY" - <<'PY'
import glob
import os
import xml.etree.ElementTree as ET

totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
print()
for path in sorted(glob.glob("test-results/*.xml")):
    run = dict.fromkeys(totals, 0)
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in totals:
            run[key] += int(suite.get(key, 0))
            totals[key] += int(suite.get(key, 0))
    failed = run["failures"] + run["errors"]
    name = os.path.basename(path).removesuffix(".xml")
    print(f"{name:40} {run['tests'] - failed - run['skipped']:4} passed, {failed} failed")
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"\ntotal: {passed} passed, {failed} failed, {totals['skipped']} skipped")
# Each failure's run, test and message, last: a CI log cut short keeps its end.
for path in sorted(glob.glob("test-results/*.xml")):
    run = os.path.basename(path).removesuffix(".xml")
    for case in ET.parse(path).getroot().iter("testcase"):
        for outcome in (*case.iter("failure"), *case.iter("error")):
            message = " ".join((outcome.get("message") or outcome.text or "").split())
            print(f"\nFAILED in {run}: {case.get('classname')}::{case.get('name')}")
            print(f"    {message[:600]}")
PY
exit $status
