#!/usr/bin/env bash
# The README's test command (`make test`): installs the project into .venv, runs ruff,
# mypy and makemigrations --check, then the test suite on SQLite, MariaDB/MySQL and
# PostgreSQL (Redis is used by the lock tests). A server that cannot be reached is a
# loud failure under CI=true, and a loud skip of that database's run otherwise.
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
    "$PY" -m pip install -q -e '.[mysql,postgres,redis,dev]' || exit 1
    touch "$stamp"
fi

status=0
say "ruff"
"$VENV/bin/ruff" check django_dbqueue testproject tests || status=1
say "mypy (django-stubs)"
"$VENV/bin/mypy" django_dbqueue || status=1
say "makemigrations --check"
DBQUEUE_DB=sqlite "$PY" manage.py makemigrations --check --dry-run || status=1
if [[ $LINT_ONLY == 1 ]]; then exit $status; fi

# The README's first command, in a virtualenv of its own with no extras installed, as a
# user on a fresh clone would run it.
say "make demo (SQLite, base install only)"
if demo_out=$(make demo VENV=.venv-demo 2>&1); then
    if ! grep -q "Finished: 5000 done, 1 failed" <<<"$demo_out"; then
        printf '%s\n' "$demo_out" | tail -20
        loud "make demo ran but did not report 5000 done and 1 failed"
        status=1
    else
        grep "Finished:" <<<"$demo_out"
    fi
else
    printf '%s\n' "$demo_out" | tail -20
    loud "make demo failed"
    status=1
fi

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

mkdir -p test-results
rm -f test-results/*.xml
for db in $DATABASES; do
    if ! server_up "$db"; then
        loud "The $db server is not reachable: its test run is SKIPPED${CI:+ and, under CI, that is a failure}"
        if [[ "${CI:-}" == "true" ]]; then status=1; fi
        continue
    fi
    say "pytest on $db"
    DBQUEUE_DB=$db "$PY" -m pytest -p no:cacheprovider --junitxml="test-results/$db.xml" "$@"
    code=$?
    # pytest exits 5 when it collected nothing: that is a failure here too.
    if [[ $code != 0 ]]; then status=1; fi
    # The queue's tables in a second database, behind a router (docs/databases.md).
    say "pytest on $db, the queue in a second database"
    DBQUEUE_QUEUE_DB=1 DBQUEUE_DB=$db "$PY" -m pytest -p no:cacheprovider \
        --junitxml="test-results/$db-queue-db.xml" tests/test_second_database.py "$@"
    code=$?
    # Extra arguments (-k ...) may select none of these tests: only then is 5 fine.
    if [[ $code != 0 && ! ( $code == 5 && $# -gt 0 ) ]]; then status=1; fi
done

"$PY" - <<'PY'
import glob
import xml.etree.ElementTree as ET

totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sorted(glob.glob("test-results/*.xml")):
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"\nall databases: {passed} passed, {failed} failed, {totals['skipped']} skipped")
PY
exit $status
