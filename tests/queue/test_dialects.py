"""The vendor differences of the queue live in ``queue/dialects/``: nothing else asks
which database it runs on, and each database has one dialect object per connection."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import connection

from django_dbqueue.queue.dialects import Dialect, dialect
from django_dbqueue.queue.dialects.choice import BY_VENDOR
from tests.support import ROOT

PACKAGE = ROOT / "django_dbqueue"

# Where reading ``.vendor`` is the point. Each entry says why.
ALLOWED = (
    "queue/dialects/",  # the queue's vendor differences, all of them
    "locks/",  # one lock backend per database by design
    "checks.py",  # checks that the lock backend fits its database: the locks' concern
    "migrations/",  # schema per database (partial and virtual-column indexes)
    # The benchmark measures each database against a driver-only yardstick of its own;
    # it is moving into django_dbqueue/bench/.
    "bench/",
    "worker/bench.py",
    "worker/baseline.py",
    "management/commands/dbqueue_bench.py",
)


def vendor_reads(path: Path) -> list[int]:
    """The lines of ``path`` that read an attribute named ``vendor``."""
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "vendor"
    ]


@pytest.mark.only_vendor("sqlite")  # the code's shape is the same on every database
def test_no_module_outside_the_dialects_reads_the_database_vendor() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith(ALLOWED):
            continue
        found += [f"django_dbqueue/{name}:{line}" for line in vendor_reads(path)]
    assert found == []


@pytest.mark.only_vendor("sqlite")
def test_the_scan_sees_a_vendor_read(tmp_path: Path) -> None:
    module = tmp_path / "branchy.py"
    module.write_text(
        "def f(conn, connections):\n"
        "    if conn.vendor == 'mysql':\n"
        "        return connections['default'].vendor\n"
    )
    assert vendor_reads(module) == [2, 3]


@pytest.mark.only_vendor("sqlite")
def test_every_dialect_method_is_part_of_the_interface() -> None:
    """A database's dialect overrides the interface; it adds nothing the queue would
    have to ask for by vendor."""
    interface = {name for name in vars(Dialect) if not name.startswith("_")}
    for chosen in BY_VENDOR.values():
        for cls in type(chosen).__mro__:
            if cls is Dialect or cls is object:
                break
            extra = {name for name in vars(cls) if not name.startswith("_")} - interface
            assert extra == set(), (cls.__name__, extra)


def test_the_connection_speaks_its_own_dialect_chosen_once() -> None:
    chosen = dialect(connection)
    assert chosen.vendor == connection.vendor
    assert dialect(connection) is chosen
    assert isinstance(chosen, BY_VENDOR[connection.vendor].__class__)
