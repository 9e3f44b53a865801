"""The test matrix: Python 3.11-3.13 x Django 5.2, 6.0, 6.1.

One session per cell and kind of run, each in a uv virtualenv of its own:

    nox -l                                    # every session
    nox                                       # what `make test` runs (below)
    nox -s "smoke(3.12-django6.0)"            # one cell's smoke suite (SQLite)
    nox -s "full(3.13-django6.1)"             # the whole suite, once per database
    DBQUEUE_TEST_DATABASES=sqlite nox -s "full(3.11-django5.2)" -- -k claim
    nox -s "fresh(3.12-django6.1)"            # only the new projects from the built wheel
    DBQUEUE_TEST_DATABASES=mysql nox -s "stack(3.11-django5.2)"   # no worker processes
    nox -s galera                             # the Galera suite (a 3-node cluster of its own)

`make test` (scripts/test.sh) runs a diagonal of that matrix in three streams side by
side: `full` (every test) on SQLite and MariaDB at the newest corner and on PostgreSQL at
the oldest (the SQLite run includes the fresh-project tests); `stack` (every test that
starts no worker process) on SQLite and MariaDB at the oldest and PostgreSQL at the
newest; `fresh` at the oldest; `smoke` on every other cell (with tests/tasks on Django
6.0, which no corner covers); the Galera suite (`galera`); then the tests that restart a
server (DBQUEUE_TEST_RESTARTS=only). `nox` alone runs `full` on every database at both
corners.
Arguments after `--` go to pytest. Coverage data goes to .coverage-data/ (one file per
process; scripts/test.sh combines them).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent

nox.options.default_venv_backend = "uv"
# Interpreters come from the machine (pyenv here), never from a download: a missing one
# is a loud error, not a fetch from the network.
nox.options.download_python = "never"
nox.options.error_on_missing_interpreters = True

# Django 6 needs Python 3.12+.
DJANGO = {"5.2": "Django>=5.2,<6.0", "6.0": "Django>=6.0,<6.1", "6.1": "Django>=6.1,<6.2"}
CELLS = [
    ("3.11", "5.2"),
    ("3.12", "5.2"),
    ("3.13", "5.2"),
    ("3.12", "6.0"),
    ("3.13", "6.0"),
    ("3.12", "6.1"),
    ("3.13", "6.1"),
]
CORNERS = [("3.11", "5.2"), ("3.13", "6.1")]
MATRIX = [nox.param(py, dj, id=f"{py}-django{dj}") for py, dj in CELLS]
nox.options.sessions = [
    f"{kind}({py}-django{dj})"
    for py, dj in CELLS
    for kind in ["full" if (py, dj) in CORNERS else "smoke"]
]
DATABASES = ("sqlite", "mysql", "postgres")


def _add_pyenv_interpreters() -> None:
    """Put pyenv's python3.X on PATH: its shims fail unless PYENV_VERSION names them."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = []
    for minor in ("3.11", "3.12", "3.13"):
        versions = sorted(glob.glob(os.path.join(root, "versions", f"{minor}.*", "bin")))
        if versions:
            found.append(versions[-1])
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])


_add_pyenv_interpreters()


def install(session: nox.Session, django: str) -> None:
    # The django-tasks backport is Django 5.2's @task; Django 6 has django.tasks.
    extras = "mysql,postgres,redis,test" + (",tasks" if django == "5.2" else "")
    session.install("-e", f".[{extras}]", DJANGO[django])
    session.run(
        "python",
        "-c",
        "import django, sys; print('Django', django.__version__, "
        "'on Python', sys.version.split()[0])",
    )


def pytest(
    session: nox.Session, db: str, *args: str, run: str = "", measure: bool = True, **env_: str
) -> None:
    """pytest, under coverage unless ``measure`` is off (the runs that repeat a subset of
    the full runs on another cell: ``stack``, ``smoke``, ``fresh``; coverage costs the
    tests' processes a quarter to half more CPU, and on CI's two cores every stream pays
    for it: README, "Running the tests").
    Selecting no test (exit 5) fails the run, unless arguments after ``--`` narrow it
    (``-k claim`` selects nothing in some runs)."""
    data = ROOT / ".coverage-data"
    data.mkdir(exist_ok=True)
    env = {
        "DBQUEUE_DB": db,
        "COVERAGE_FILE": str(data / ".coverage"),
        # sys.monitoring, where there is one (3.12+): the cheaper tracer (setup.cfg).
        **({} if session.python == "3.11" else {"COVERAGE_CORE": "sysmon"}),
        # Two runs at once (parallel checkouts, `make test`'s two streams) must not share
        # a test database (nor, through testproject's settings, a Redis key prefix).
        "DBQUEUE_TEST_DB_NAME": os.environ.get("DBQUEUE_TEST_DB_NAME")
        or "test_dbq_" + "".join(c if c.isalnum() else "_" for c in f"{session.name}_{db}"),
        **env_,
    }
    results = ROOT / "test-results"
    results.mkdir(exist_ok=True)
    name = f"{session.name}-{db}{run and '-' + run}".translate(str.maketrans("()", "--"))
    junit = results / f"{name}.xml"
    session.run(
        *(["coverage", "run", "-m", "pytest"] if measure else ["pytest"]),
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *args,
        *session.posargs,
        env=env,
        success_codes=[0, 5] if session.posargs else [0],
    )


def selected_databases() -> list[str]:
    chosen = os.environ.get("DBQUEUE_TEST_DATABASES", " ".join(DATABASES)).split()
    unknown = set(chosen) - set(DATABASES)
    if unknown:
        raise SystemExit(f"DBQUEUE_TEST_DATABASES: unknown {sorted(unknown)}")
    return chosen


def left_to_scale(db: str) -> list[str]:
    """DBQUEUE_TEST_LEAVE_TO_SCALE=1 (`make test`, whose third stream runs the ``scale``
    session): the full and stack runs on MariaDB and PostgreSQL leave out what that
    session runs on its own servers (SCALE_TESTS, and in `full` the replica suite),
    instead of running it twice. The pytest arguments that leave them out (a truthy
    list: leave the replica suite out too)."""
    if db == "sqlite" or os.environ.get("DBQUEUE_TEST_LEAVE_TO_SCALE", "") != "1":
        return []
    return [f"--ignore={path}" for path in SCALE_TESTS[1:]]


def restarts() -> str:
    """DBQUEUE_TEST_RESTARTS: "with" (default) runs the tests that restart a database
    server with the rest; "without" leaves them out and "only" runs just them, so that
    `make test` can run its SQLite and server runs side by side and the restarts after."""
    phase = os.environ.get("DBQUEUE_TEST_RESTARTS", "with")
    if phase not in {"with", "without", "only"}:
        raise SystemExit(f"DBQUEUE_TEST_RESTARTS: {phase!r} is not with, without or only")
    return phase


@nox.session
@nox.parametrize("python,django", MATRIX)
def full(session: nox.Session, django: str) -> None:
    """The whole suite on each database in DBQUEUE_TEST_DATABASES (default: all three)."""
    install(session, django)
    phase = restarts()
    failed = []
    for db in selected_databases():
        if phase == "only":
            if db != "sqlite":  # SQLite has no server to restart
                try:
                    pytest(session, db, "-m", "server_restart", run="restarts")
                except nox.command.CommandFailed:
                    failed.append(f"{db} (server restarts)")
            continue
        try:
            pytest(
                session,
                db,
                *(["-m", "not server_restart"] if phase == "without" else []),
                *left_to_scale(db),
            )
        except nox.command.CommandFailed:
            failed.append(db)
        # The queue's tables in a second database, behind a router (docs/databases.md):
        # only the second_database tests run, and only this way.
        try:
            second = "tests/test_second_database.py"
            pytest(session, db, second, run="queue-db", DBQUEUE_QUEUE_DB="1")
        except nox.command.CommandFailed:
            failed.append(f"{db} (queue in a second database)")
        # A primary and a replica lagging on purpose, started by the tests (ports 3310-3311,
        # data under DBQUEUE_REPLICA_DIR): only the replica tests run, and only this way.
        if db == "mysql" and not left_to_scale(db):
            try:
                pytest(session, db, "tests/replica", run="replica", DBQUEUE_TEST_REPLICA="1")
            except nox.command.CommandFailed:
                failed.append(f"{db} (reads through a lagging replica)")
    if failed:
        session.error(f"the suite failed on {', '.join(failed)}")


@nox.session
@nox.parametrize("python,django", MATRIX)
def stack(session: nox.Session, django: str) -> None:
    """The suite without worker processes, browsers or fresh projects (the SQL the ORM
    and the dialects build, the admin's queries, the options, the locks in one process)
    on each server database in DBQUEUE_TEST_DATABASES: `make test` runs it on the corner
    whose `full` run leaves that server out (see scripts/test.sh)."""
    install(session, django)
    failed = []
    for db in selected_databases():
        try:
            pytest(
                session,
                db,
                "-m",
                "not processes and not browser and not fresh and not server_restart",
                *left_to_scale(db),
                measure=False,
            )
        except nox.command.CommandFailed:
            failed.append(db)
    if failed:
        session.error(f"the suite without processes failed on {', '.join(failed)}")


@nox.session
@nox.parametrize("python,django", MATRIX)
def smoke(session: nox.Session, django: str) -> None:
    """On SQLite: the smoke suite (checks, migrate, enqueue, run_jobs, admin, @task); on a
    Django that no corner's full run covers (6.0), the Django Tasks tests too, the part of
    the app that differs most between Djangos."""
    install(session, django)
    runs = [("", ("-m", "smoke"))]
    if django not in {dj for _, dj in CORNERS}:
        runs.append(("tasks", ("tests/tasks",)))
    failed = []
    for run, args in runs:
        try:
            pytest(session, "sqlite", *args, run=run, measure=False)
        except nox.command.CommandFailed:
            failed.append(" ".join(args))
    if failed:
        session.error(f"failed: {', '.join(failed)}")


@nox.session
@nox.parametrize("python,django", MATRIX)
def fresh(session: nox.Session, django: str) -> None:
    """Brand-new projects with the app installed from the built wheel (SQLite)."""
    install(session, django)
    pytest(session, "sqlite", "-m", "fresh", measure=False)


@nox.session(python="3.11")
def galera(session: nox.Session) -> None:
    """The Galera suite: a 3-node MariaDB Galera Cluster started on loopback by the tests
    themselves (tests/support/galera.py: ports 3321-3323, 4601-4623, data under
    DBQUEUE_GALERA_DIR), the tests marked galera against it, the cluster stopped at the
    end. Needs Debian's mariadb-server and galera-4 packages and root (the nodes run as
    the mysql user). One run at a time per machine: the ports are fixed."""
    install(session, "5.2")
    pytest(session, "mysql", "-m", "galera", "tests/galera", DBQUEUE_TEST_GALERA="1")


# The scale suite's private servers and the tests that start their own, on ports of their
# own (`full` and `galera` may run beside it): overridable for a machine where they are
# taken.
SCALE_PORTS = {
    "DBQUEUE_SCALE_MYSQL_PORT": "3330",
    "DBQUEUE_SCALE_PG_PORT": "3331",
    "DBQUEUE_PGBOUNCER_PORT": "3332",
    "DBQUEUE_REPLICA_PORTS": "3333 3334",
}
# Many hosts on one database (issue #26): three hosts' drains counted by the server and
# over 20 ms round trips (tests/scale, run only here), hosts whose clocks are 90 s off,
# and the PgBouncer tests.
SCALE_TESTS = (
    "tests/scale",
    "tests/worker/test_clock_skew.py",
    "tests/worker/test_pooler_wakeup.py",
    "tests/queue/test_pooler.py",
    "tests/locks/test_pooler.py",
)


@nox.session(python="3.13")
def scale(session: nox.Session) -> None:
    """Many hosts, one database: tests/support/scale_servers.py starts a private MariaDB
    (statements counted per user) and PostgreSQL (room for 3 hosts x 16 children), the
    SCALE_TESTS run on each, then the replica suite (a lagging replica of its own), and
    the servers stop. About 4 minutes on 2 cores (README, "Running the tests"). Needs root, Debian's
    mariadb-server, postgresql-15, pgbouncer and faketime."""
    install(session, "6.1")
    ports = {key: os.environ.get(key, default) for key, default in SCALE_PORTS.items()}
    where = {
        "DBQUEUE_SCALE_DIR": os.environ.get("DBQUEUE_SCALE_DIR", "/var/tmp/dbqueue-scale"),
        "DBQUEUE_PGBOUNCER_DIR": "/var/tmp/dbqueue-scale-pgbouncer",
        "DBQUEUE_REPLICA_DIR": "/var/tmp/dbqueue-scale-replica",
    }
    servers = ["python", "-m", "tests.support.scale_servers"]
    session.run(*servers, "start", env={**ports, **where})
    failed = []
    try:
        on = {
            "MYSQL_PORT": ports["DBQUEUE_SCALE_MYSQL_PORT"],
            "PGPORT": ports["DBQUEUE_SCALE_PG_PORT"],
        }
        for db in ("mysql", "postgres"):
            try:
                pytest(session, db, *SCALE_TESTS, DBQUEUE_TEST_SCALE="1", **ports, **where, **on)
            except nox.command.CommandFailed:
                failed.append(db)
        try:
            replica = {"DBQUEUE_TEST_REPLICA": "1", **ports, **where}
            pytest(session, "mysql", "tests/replica", run="replica", **replica)
        except nox.command.CommandFailed:
            failed.append("mysql (reads through a lagging replica)")
    finally:
        session.run(*servers, "stop", env={**ports, **where})
    if failed:
        session.error(f"the scale suite failed on {', '.join(failed)}")
