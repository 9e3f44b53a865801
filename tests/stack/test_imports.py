"""Every module of the app imports in a plain project: no type-stub monkeypatching, and
no django-tasks backport unless the Django version has `django.tasks` built in.

Subscripting a Django class at run time (`Paginator[Any]`, `models.Field[Any, Any]`,
`Task[P, T]`) only works after `django_stubs_ext.monkeypatch()`, which the django-tasks
backport happens to call when it is imported. A test run with the backport installed
would never see such a crash; this child process blocks both, then imports everything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT

# Imports do not depend on the database: the SQLite runs (and every smoke run) have it.
pytestmark = [pytest.mark.smoke, pytest.mark.only_vendor("sqlite")]

CHILD = r"""
import importlib, importlib.util, json, pkgutil, sys, traceback
# Neither can be imported in this process: nothing patches Django's classes.
sys.modules["django_stubs_ext"] = None
sys.modules["django_tasks"] = None

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
        "django.contrib.sessions", "django.contrib.messages", "django_dbqueue",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()

import django_dbqueue

outcome = {"framework": importlib.util.find_spec("django.tasks") is not None, "modules": {}}
names = sorted(
    m.name for m in pkgutil.walk_packages(django_dbqueue.__path__, "django_dbqueue.")
)
for name in names:
    try:
        importlib.import_module(name)
        outcome["modules"][name] = "ok"
    except BaseException:
        outcome["modules"][name] = traceback.format_exc()
print(json.dumps(outcome))
"""

# What a module that needs the Tasks framework says when there is none.
NO_FRAMEWORK = "DBQueueBackend needs the Django Tasks framework"


def test_every_module_imports_without_stub_patches_or_the_backport() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout.splitlines()[-1])
    modules = outcome["modules"]
    assert "django_dbqueue.models" in modules and "django_dbqueue.locks" in modules
    failed = {name: error for name, error in modules.items() if error != "ok"}
    if outcome["framework"]:
        assert failed == {}, "\n".join(failed.values())
    else:
        # Django 5.2 without the backport: only the Tasks backend's modules may refuse,
        # and they say what to install.
        wrong = {name: error for name, error in failed.items() if NO_FRAMEWORK not in error}
        assert wrong == {}, "\n".join(wrong.values())
        assert "django_dbqueue.admin" not in failed
