"""Settings of the demo and test project.

The database comes from DBQUEUE_DB (sqlite, mysql or postgres; default sqlite), so one
test suite runs on all three. DBQUEUE_DB_NAME names the database (tests set it so worker
processes they start use the test database).
"""

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "dbqueue-demo-not-secret"
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbqueue",
    "testproject",
]
# Django 6 has django.tasks built in; Django 5.2 has @task only with the django-tasks
# backport (the `tasks` extra). The demo runs without either.
HAS_DJANGO_TASKS = importlib.util.find_spec("django.tasks") is not None
HAS_TASKS_BACKPORT = importlib.util.find_spec("django_tasks") is not None
if HAS_TASKS_BACKPORT and not HAS_DJANGO_TASKS:
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_dbqueue"), "django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"

DB_VENDOR = os.environ.get("DBQUEUE_DB", "sqlite")
DB_NAME = os.environ.get("DBQUEUE_DB_NAME", "")
# Lets two test runs share one server (parallel checkouts): each names its test database.
TEST_DB_NAME = os.environ.get("DBQUEUE_TEST_DB_NAME") or None

DATABASES: dict[str, dict[str, Any]]
if DB_VENDOR == "sqlite":
    sqlite_path = DB_NAME or str(BASE_DIR / "demo.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": sqlite_path,
            # Workers are separate processes: WAL lets readers run beside the writer,
            # and the timeout makes "database is locked" a wait instead of an error.
            "OPTIONS": {
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": str(BASE_DIR / f".{TEST_DB_NAME or 'test-db'}.sqlite3")},
        }
    }
elif DB_VENDOR == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME or "dbqueue",
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {
                "CHARSET": "utf8mb4",
                "COLLATION": "utf8mb4_unicode_ci",
                "NAME": TEST_DB_NAME,
            },
        }
    }
elif DB_VENDOR == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME or "dbqueue",
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": TEST_DB_NAME},
        }
    }
    # Through a pooler in transaction mode (tests/support/pgbouncer.py, PGPORT=6432): a
    # server-side cursor would outlive the transaction that lent it its connection, and
    # PgBouncer before 1.21 keeps no prepared statement. Directly: enqueue's INSERT is
    # prepared after 5 enqueues on a connection (docs/databases.md, "PostgreSQL: a
    # prepared enqueue").
    if os.environ.get("DBQUEUE_TEST_PGBOUNCER") == "1":
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    else:
        DATABASES["default"]["OPTIONS"] = {"prepare_threshold": 5}
else:
    raise RuntimeError(f"DBQUEUE_DB must be sqlite, mysql or postgres, not {DB_VENDOR!r}")

# DBQUEUE_QUEUE_DB=1: the queue's tables move to a second database, "queue", on the same
# server (docs/databases.md); DBQUEUE_QUEUE_DB_NAME names it as DBQUEUE_DB_NAME does the first.
QUEUE_DB = os.environ.get("DBQUEUE_QUEUE_DB", "") == "1"
if QUEUE_DB:
    QUEUE_DB_NAME = os.environ.get("DBQUEUE_QUEUE_DB_NAME", "")
    queue_test = dict(DATABASES["default"]["TEST"])
    if DB_VENDOR == "sqlite":
        queue_name = QUEUE_DB_NAME or str(BASE_DIR / "demo-queue.sqlite3")
        queue_test["NAME"] = str(BASE_DIR / f".{TEST_DB_NAME or 'test-db'}-queue.sqlite3")
    else:
        queue_name = QUEUE_DB_NAME or "dbqueue_queue"
        queue_test["NAME"] = f"{TEST_DB_NAME}_queue" if TEST_DB_NAME else None
    DATABASES["queue"] = {**DATABASES["default"], "NAME": queue_name, "TEST": queue_test}
    DATABASE_ROUTERS = ["testproject.routers.QueueRouter"]

# DBQUEUE_TEST_REPLICA=1 (tests/replica, tests/support/replica.py): "default" is the suite's
# private MariaDB primary on 3310 and "replica" the same database on its replica on 3311
# (DBQUEUE_REPLICA_PORTS="3333 3334" moves them: `nox -s scale` may run beside `full`);
# DBQUEUE_READ_REPLICA=1 also installs a router sending every read there (the pytest
# process itself reads the primary: there "replica" mirrors "default").
REPLICA = os.environ.get("DBQUEUE_TEST_REPLICA", "") == "1"
if REPLICA:
    if DB_VENDOR != "mysql":
        raise RuntimeError("DBQUEUE_TEST_REPLICA=1 needs DBQUEUE_DB=mysql")
    primary, replica = os.environ.get("DBQUEUE_REPLICA_PORTS", "3310 3311").split()
    DATABASES["default"]["PORT"] = primary
    DATABASES["replica"] = {**DATABASES["default"], "PORT": replica, "TEST": {"MIRROR": "default"}}
    if os.environ.get("DBQUEUE_READ_REPLICA", "") == "1":
        DATABASE_ROUTERS = ["testproject.routers.ReplicaRouter"]

REDIS_URL = os.environ.get("DBQUEUE_REDIS_URL", "redis://127.0.0.1:6379/0")
CACHES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}
# The demo installs no extras; the tests install django-redis (the [redis] extra).
if importlib.util.find_spec("django_redis"):
    CACHES["redis"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        # Test runs that share the Redis server (`make test` runs two at once) must not
        # wake each other's workers.
        "KEY_PREFIX": f"{DB_VENDOR}:{TEST_DB_NAME or 'demo'}",
    }

DBQUEUE: dict[str, Any] = {
    "QUEUES": ["default", "emails", "reports"],
    "LOCK_REDIS_ALIAS": "redis",
    # The test suite's jobs: tests/ is not an installed app, so the task discovery (every
    # app's tasks.py and jobs.py, like testproject/jobs.py) would not find them.
    "TASK_MODULES": ["tests.support.jobs", "tests.support.flow_jobs", "tests.worker.hostile"],
}
if QUEUE_DB:
    # Database locks beside the queue: their fencing tokens live in dbqueue_counter.
    DBQUEUE["LOCK_DATABASE_ALIAS"] = "queue"
if importlib.util.find_spec("django_tasks") or importlib.util.find_spec("django.tasks"):
    DBQUEUE["TASK_MODULES"] += ["tests.support.task_functions", "tests.support.conformance_tasks"]

# @task functions (Django Tasks) go through the same Job table and run_jobs workers.
if HAS_DJANGO_TASKS or HAS_TASKS_BACKPORT:
    TASKS = {"default": {"BACKEND": "django_dbqueue.backends.DBQueueBackend"}}

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_dbqueue": {"handlers": ["console"], "level": "WARNING"}},
}

# A test that reads what a worker logged names a file; retention logs each DELETE there.
if os.environ.get("DBQUEUE_TEST_LOG_FILE"):
    LOGGING["handlers"]["file"] = {
        "class": "logging.FileHandler",
        "filename": os.environ["DBQUEUE_TEST_LOG_FILE"],
        "formatter": "plain",
    }
    LOGGING["loggers"]["django_dbqueue.retention"] = {
        "handlers": ["file"],
        "level": "DEBUG",
        "propagate": False,
    }

# Tests that count what a worker logs at DEBUG name those loggers (comma-separated).
for _logger in filter(None, os.environ.get("DBQUEUE_TEST_DEBUG_LOGGERS", "").split(",")):
    LOGGING["loggers"][_logger] = {"level": "DEBUG"}

# Tests pass settings to the worker processes they start through the environment.
DBQUEUE.update(json.loads(os.environ.get("DBQUEUE_SETTINGS_JSON", "{}")))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("DBQUEUE_TEST_CLOCK_FILE"):
    from testproject.test_clock import install

    install(os.environ["DBQUEUE_TEST_CLOCK_FILE"])
