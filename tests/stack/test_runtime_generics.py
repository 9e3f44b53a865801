"""No code of the app subscripts a Django class at run time unless that Django version's
class really is generic.

`Paginator[Any]` as a base class, `cast(models.Field[Any, Any], f)` in a function body
or `Task[P, T]` as a base only work after `django_stubs_ext.monkeypatch()` (which the
django-tasks backport calls on import), so they pass in one environment and crash in
another. This test finds every subscript that runs (not annotations under
`from __future__ import annotations`, not `if TYPE_CHECKING:` blocks), resolves what it
subscripts, and tries it in a process where nothing has patched Django.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, parse_source

# Imports do not depend on the database: the SQLite runs (and every smoke run) have it.
pytestmark = [pytest.mark.smoke, pytest.mark.only_vendor("sqlite")]

APP = ROOT / "django_dbqueue"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported_names(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> dotted path, for the module's imports (relative ones resolved)."""
    names: dict[str, str] = {}
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def dotted(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return None if inner is None else [*inner, node.attr]
    return None


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_subscripts(tree: ast.Module, lazy_annotations: bool) -> Iterator[ast.Subscript]:
    """Subscript expressions that are evaluated when the module is imported or run."""

    def visit(node: ast.AST) -> Iterator[ast.Subscript]:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child)
            return
        if isinstance(node, ast.Subscript):
            yield node
        for field, value in ast.iter_fields(node):
            if lazy_annotations and field in ("annotation", "returns"):
                continue
            if isinstance(node, ast.AnnAssign) and field == "annotation":
                continue  # only evaluated at module and class level, and then cheap to check
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, ast.AST):
                    yield from visit(child)

    yield from visit(tree)


def candidates() -> dict[str, list[str]]:
    """Dotted path of what is subscripted -> the places (file:line) that do it."""
    found: dict[str, list[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        tree = parse_source(path.read_text(), str(path))
        lazy = any(
            isinstance(n, ast.ImportFrom)
            and n.module == "__future__"
            and any(a.name == "annotations" for a in n.names)
            for n in tree.body
        )
        names = imported_names(tree, module_name(path))
        for node in runtime_subscripts(tree, lazy):
            parts = dotted(node.value)
            if not parts or parts[0] not in names:
                continue
            target = ".".join([names[parts[0]], *parts[1:]])
            place = f"{path.relative_to(ROOT)}:{node.lineno}"
            found.setdefault(target, []).append(place)
    return found


CHILD = r"""
import importlib, json, sys
from typing import Any
sys.modules["django_stubs_ext"] = None  # nothing may patch Django's classes here

import django
from django.conf import settings
settings.configure(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"])
django.setup()

report = {}
for target in json.loads(sys.argv[1]):
    module, _, attr = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # e.g. the backport, which imports django_stubs_ext
        report[target] = f"unresolved: {exc!r}"
        continue
    owner = getattr(obj, "__module__", "") or ""
    if not isinstance(obj, type) or not owner.startswith(("django.", "django_tasks")):
        report[target] = "not a Django class"
        continue
    try:
        obj[Any]
        report[target] = "generic"
    except TypeError as exc:
        report[target] = f"NOT generic: {exc}"
print(json.dumps(report))
"""


def test_the_scan_sees_subscripts_in_bodies_and_bases_but_not_annotations() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING, Any, cast\n"
        "from django.core.paginator import Paginator\n"
        "from django.db import models\n"
        "if TYPE_CHECKING:\n"
        "    X = Paginator[Any]\n"
        "class P(Paginator[Any]): ...\n"
        "def f(x: Paginator[Any]) -> models.Field[Any, Any]:\n"
        "    return cast(models.Field[Any, Any], x)\n"
    )
    tree = parse_source(source)
    names = imported_names(tree, "django_dbqueue.example")
    lines = sorted(node.lineno for node in runtime_subscripts(tree, lazy_annotations=True))
    assert lines == [7, 9]
    assert names["Paginator"] == "django.core.paginator.Paginator"
    assert names["models"] == "django.db.models"


def test_no_runtime_subscript_of_a_django_class_that_is_not_generic() -> None:
    found = candidates()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(sorted(found))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    broken = {
        f"{target} ({verdict}) at {', '.join(found[target])}"
        for target, verdict in report.items()
        if verdict.startswith("NOT generic")
    }
    assert broken == set()
