"""Jobs of the workflow tests: they record their runs as rows the tests can read."""

from __future__ import annotations

from typing import Any

from django_dbqueue import job
from django_dbqueue.workflows.results import dependency_results, previous_result


@job
def value(n: int) -> int:
    return n


@job
def plus_previous(n: int) -> int:
    before = previous_result()
    return n + (before or 0)


@job
def sum_dependencies() -> int:
    return sum(dependency_results().values())


@job
def explode() -> None:
    raise RuntimeError("explode")


@job
def on_batch(tag: str, batch: dict[str, Any]) -> dict[str, Any]:
    return {"tag": tag, **batch}
