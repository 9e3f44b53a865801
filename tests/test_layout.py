"""The package's layout holds: every module is in a room, rooms import downwards only, no
import cycle (counting imports made inside functions, which are allowed only where listed),
docs/architecture.md names every module, and the code runs without the type stubs'
run-time patches."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import ROOT, parse_source

# The code's shape is the same whichever database a run uses.
pytestmark = pytest.mark.only_vendor("sqlite")

PACKAGE = ROOT / "django_dbqueue"
MAP = ROOT / "docs" / "architecture.md"

# The rooms, bottom up. A module may import its own room, a room of a lower rank, or a
# room of its own rank (peers), never a higher one; the import graph has no cycle
# (tested below), so peers cannot lean on each other both ways.
RANK = {
    "base": 0,  # conf, status, exceptions, signals: what every room may use
    "queue": 1,  # queue/ and models.py: the tables and every state change's SQL
    "enqueue": 2,  # bounds, options, registry, enqueueing, bulk
    "scheduling": 2,
    "worker": 2,
    "locks": 2,  # separate: see SEPARATE
    "observability": 2,
    "workflows": 2,
    "shell": 3,  # the package's root API, apps, checks, backends, testing
    "admin": 3,
    "tasks": 3,
    "management": 3,
    "bench": 3,
}
ROOT_MODULES = {
    "django_dbqueue.conf": "base",
    "django_dbqueue.status": "base",
    "django_dbqueue.exceptions": "base",
    "django_dbqueue.signals": "base",
    "django_dbqueue.models": "queue",
    "django_dbqueue.bounds": "enqueue",
    "django_dbqueue.options": "enqueue",
    "django_dbqueue.registry": "enqueue",
    "django_dbqueue.enqueueing": "enqueue",
    "django_dbqueue.bulk": "enqueue",
    "django_dbqueue.arguments": "enqueue",
    "django_dbqueue.task_names": "enqueue",
    "django_dbqueue.signatures": "enqueue",
    "django_dbqueue": "shell",
    "django_dbqueue.apps": "shell",
    "django_dbqueue.checks": "shell",
    "django_dbqueue.deployment_checks": "shell",
    "django_dbqueue.backends": "shell",
    "django_dbqueue.testing": "shell",
    "django_dbqueue.pytest_plugin": "shell",
}
# Rooms that stand apart: they import only lower ranks, and no room of their rank
# imports them (named locks serve the app, not the queue).
SEPARATE = {"locks"}

# Imports of this package made inside a function, each with why it cannot be at the
# top of its module. Nothing else may import inside a function: a cycle is fixed by
# moving code, not by hiding the import.
LAZY_IMPORTS = {
    # The package is importable before the app registry is ready (@job at import time);
    # enqueueing and bulk import the models.
    ("django_dbqueue", "django_dbqueue.enqueueing"),
    ("django_dbqueue", "django_dbqueue.bulk"),
    ("django_dbqueue", "django_dbqueue.workflows.batches"),
    # AppConfig.ready(): where Django wires an app once its models are loaded.
    ("django_dbqueue.apps", "django_dbqueue.checks"),
    ("django_dbqueue.apps", "django_dbqueue.signals"),
    ("django_dbqueue.apps", "django_dbqueue.tasks"),
    ("django_dbqueue.apps", "django_dbqueue.queue.announce"),
    # redis is an optional package.
    ("django_dbqueue.locks.counters", "django_dbqueue.locks.redis"),
    # prometheus_client is an optional package, imported only for --metrics-port.
    ("django_dbqueue.management.commands.run_jobs", "django_dbqueue.observability.metrics"),
    # named_lock is importable before the app registry is ready (decorating at import).
    ("django_dbqueue.locks.counters", "django_dbqueue.models"),
    # The Tasks room: the framework (django.tasks or the backport) is imported only when
    # a Task runs or finishes, and the backend class may be loaded from settings before
    # the app registry is ready, so nothing that imports models is imported at its top.
    ("django_dbqueue.tasks", "django_dbqueue.tasks.running"),
    ("django_dbqueue.tasks", "django_dbqueue.worker.execution"),
    ("django_dbqueue.tasks.backend", "django_dbqueue.enqueueing"),
    ("django_dbqueue.tasks.backend", "django_dbqueue.models"),
    ("django_dbqueue.tasks.backend", "django_dbqueue.tasks.options"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _resolve(module: str, name: str) -> str:
    """``from module import name``: the submodule when ``name`` is one, else ``module``."""
    candidate = PACKAGE.parent / f"{module}.{name}".replace(".", "/")
    if candidate.with_suffix(".py").exists() or candidate.is_dir():
        return f"{module}.{name}"
    return module


def imports_of(path: Path) -> set[tuple[str, bool]]:
    """(module of this package, imported inside a function?) for every import in
    ``path``, at any depth; imports under ``if TYPE_CHECKING:`` are not made at run time."""
    found: set[tuple[str, bool]] = set()
    here = module_name(path)

    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = here.split(".")[: len(here.split(".")) - node.level + (path.stem == "__init__")]
        return ".".join([*base, *([node.module] if node.module else [])])

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in {
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        }:
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.ImportFrom):
            module = absolute(node)
            if module.split(".")[0] == "django_dbqueue":
                found.update((_resolve(module, a.name), in_function) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(
                (a.name, in_function)
                for a in node.names
                if a.name.split(".")[0] == "django_dbqueue"
            )
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(parse_source(path.read_text()), False)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every module -> the modules of this package it imports, wherever the import is."""
    graph = {module_name(p): {m for m, _ in imports_of(p)} for p in package_files()}
    return {m: {i for i in imported if i in graph and i != m} for m, imported in graph.items()}


def room(module: str) -> str:
    """The room of a module: its package under django_dbqueue/, or ROOT_MODULES' word."""
    return ROOT_MODULES.get(module) or module.split(".")[1]


def test_every_module_belongs_to_a_room() -> None:
    assert [m for m in import_graph() if room(m) not in RANK] == []


def test_rooms_import_only_their_own_rank_or_below() -> None:
    wrong = []
    for module, imports in import_graph().items():
        here = room(module)
        for imported in imports:
            there = room(imported)
            if there == here or RANK[there] < RANK[here]:
                continue
            if RANK[there] > RANK[here] or here in SEPARATE or there in SEPARATE:
                wrong.append(f"{module} ({here}) imports {imported} ({there})")
    assert wrong == []


def test_imports_inside_functions_are_only_the_listed_ones() -> None:
    lazy = {
        (module_name(p), imported)
        for p in package_files()
        for imported, in_function in imports_of(p)
        if in_function and imported != module_name(p)
    }
    assert sorted(lazy - LAZY_IMPORTS) == [], "move the import up, or the code down"
    assert sorted(LAZY_IMPORTS - lazy) == [], "no longer made: strike it from LAZY_IMPORTS"


def test_no_import_cycles_counting_imports_inside_functions() -> None:
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[frozenset[str]] = []

    def strongly_connected(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                strongly_connected(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                cycles.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            strongly_connected(module)
    assert sorted(map(sorted, cycles)) == []


def mapped_modules() -> list[str]:
    """The modules docs/architecture.md's map names: in its first code block, a line
    whose first word ends in ``/`` names a package (its ``__init__.py``), one whose first
    word ends in ``.py`` a module, placed by indentation (two spaces a level)."""
    text = MAP.read_text()
    block = text.split("```", 2)[1]
    named: list[str] = []
    folders: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        word = line.split()[0]
        if word.endswith("/"):
            folders[depth:] = [word.rstrip("/")]
            named.append(".".join(folders))
        elif word.endswith(".py"):
            named.append(".".join([*folders[:depth], word.removesuffix(".py")]))
    return named


def test_the_map_names_every_module_once_and_only_modules_that_exist() -> None:
    named = mapped_modules()
    real = set(import_graph())
    assert sorted({m for m in named if named.count(m) > 1}) == [], "named twice"
    assert sorted(real - set(named)) == [], "missing from docs/architecture.md"
    assert sorted(set(named) - real) == [], "named in docs/architecture.md, but gone"


def test_every_module_says_what_it_is_for() -> None:
    missing = [
        module_name(p)
        for p in PACKAGE.rglob("*.py")
        if "migrations" not in p.parts
        and p.stat().st_size
        and ast.get_docstring(parse_source(p.read_text())) is None
    ]
    assert missing == []


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_modules_and_functions_stay_small() -> None:
    """No module over 400 lines, no function over 60, unless the module's docstring gives
    the reason on a line of its own starting "Size:"."""
    too_big = []
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        source = path.read_text()
        tree = parse_source(source)
        if any(line.startswith("Size:") for line in (ast.get_docstring(tree) or "").splitlines()):
            continue
        if source.count("\n") > MAX_MODULE_LINES:
            too_big.append(f"{module_name(path)}: {source.count(chr(10))} lines")
        too_big += [
            f"{module_name(path)}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        ]
    assert too_big == []


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
