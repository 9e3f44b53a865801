"""Reading a result never imports what a row names (issue #25, item 7)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from django_dbqueue.models import Job
from django_dbqueue.tasks.results import loaded_exception_class
from tests.support import task_functions

pytestmark = pytest.mark.django_db(transaction=True)

SIDE_EFFECT = "tests.support.import_side_effect"


def crafted_errors(result_id: str, *paths: str) -> None:
    """Write failed attempts naming ``paths`` into the row, as someone with write access
    to the table (or a forged dump) could."""
    Job.objects.filter(pk=int(result_id)).update(
        status="failed",
        errors=[{"exception_class_path": p, "traceback": "", "at": ""} for p in paths],
    )


def test_a_stored_exception_path_is_never_imported_on_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv("DBQUEUE_SIDE_EFFECT_FILE", str(marker))
    monkeypatch.delitem(sys.modules, SIDE_EFFECT, raising=False)
    monkeypatch.delitem(sys.modules, "this", raising=False)  # prints the Zen when imported
    result = task_functions.add.enqueue(1, 2)
    crafted_errors(result.id, f"{SIDE_EFFECT}.Boom", "this.X", "builtins.KeyError")

    errors = task_functions.add.get_result(result.id).errors

    assert [e.exception_class_path for e in errors] == [
        f"{SIDE_EFFECT}.Boom",
        "this.X",
        "builtins.KeyError",
    ]
    for error in errors[:2]:
        with pytest.raises(ValueError, match="never imported"):
            error.exception_class  # noqa: B018 - the property is what is tested
    assert errors[2].exception_class is KeyError  # a loaded module still resolves
    assert SIDE_EFFECT not in sys.modules
    assert "this" not in sys.modules
    assert not marker.exists()


def test_only_exception_classes_of_loaded_modules_resolve() -> None:
    class Outer:
        class Inner(Exception):
            pass

    module = sys.modules[__name__]
    assert loaded_exception_class("django_dbqueue.exceptions.JobTimeout") is not None
    assert loaded_exception_class("builtins.len") is None  # not an exception class
    assert loaded_exception_class("builtins.Nope") is None
    assert loaded_exception_class("ValueError") is None  # no module named
    assert loaded_exception_class("") is None
    module.Outer = Outer  # type: ignore[attr-defined]
    try:
        assert loaded_exception_class(f"{__name__}.Outer.Inner") is Outer.Inner
    finally:
        del module.Outer  # type: ignore[attr-defined]
