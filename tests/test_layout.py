"""The package's layout holds: rooms import downwards only, no import cycles, and the
code runs without the type stubs' run-time patches."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import ROOT

# The code's shape is the same whichever database a run uses.
pytestmark = pytest.mark.only_vendor("sqlite")

PACKAGE = ROOT / "django_dbqueue"
# A room may import (at module level) only the rooms listed after it.
BELOW = {
    "queue": set(),
    "scheduling": {"queue"},
    "observability": {"queue", "scheduling"},
    "worker": {"queue", "scheduling", "observability"},
    "admin": {"queue", "worker", "scheduling", "observability"},
    "tasks": {"queue", "worker", "observability"},
    "locks": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """Modules of this package imported when ``path`` is imported (not lazily in
    functions, not under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                if ast.unparse(node.test) != "TYPE_CHECKING":
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("django_dbqueue"):
                    for alias in node.names:
                        candidate = f"{node.module}.{alias.name}"
                        is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(
                            ".py"
                        ).exists() or (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
                        found.add(candidate if is_module else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("django_dbqueue"))

    visit(tree.body)
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    return {module_name(p): top_level_imports(p) for p in files}


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in BELOW else None


def test_rooms_import_only_the_rooms_below_them() -> None:
    wrong = []
    for module, imports in import_graph().items():
        here = room(module)
        if here is None:
            continue
        for imported in imports:
            there = room(imported)
            if there is not None and there != here and there not in BELOW[here]:
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_no_import_cycles_at_module_level() -> None:
    graph = import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert cycles == []


def test_every_module_says_what_it_is_for() -> None:
    missing = [
        module_name(p)
        for p in PACKAGE.rglob("*.py")
        if "migrations" not in p.parts
        and p.stat().st_size
        and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert missing == []


def test_app_imports_without_the_type_stubs_run_time_patches(tmp_path: Path) -> None:
    """Django's classes are generic only in django-stubs; subscripting one at run time
    works only after ``django_stubs_ext.monkeypatch()``, which a project need not call."""
    (tmp_path / "plain_settings.py").write_text(
        textwrap.dedent(
            """
            SECRET_KEY = "x"
            USE_TZ = True
            INSTALLED_APPS = [
                "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                "django.contrib.sessions", "django.contrib.messages", "django_dbqueue",
            ]
            DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
            """
        )
    )
    script = textwrap.dedent(
        """
        import importlib, pkgutil
        import django
        from django.core.paginator import Paginator
        django.setup()
        import django_dbqueue
        names = [m.name for m in pkgutil.walk_packages(django_dbqueue.__path__, "django_dbqueue.")
                 if ".tasks" not in m.name and ".backends" not in m.name
                 and ".migrations" not in m.name and ".management" not in m.name]
        for name in names:
            importlib.import_module(name)
            assert not hasattr(Paginator, "__class_getitem__"), f"{name} patched Django"
        print(len(names))
        """
    )
    env = {"DJANGO_SETTINGS_MODULE": "plain_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 30
