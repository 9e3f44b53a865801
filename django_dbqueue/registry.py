"""Turning callables into task paths and task paths back into callables."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from django_dbqueue.exceptions import InvalidJob, TaskNotFound


def task_path(task: Any) -> str:
    """The dotted path under which a worker will find ``task``."""
    if isinstance(task, str):
        path = task.strip()
        if not path or "." not in path or any(not part.isidentifier() for part in path.split(".")):
            raise TaskNotFound(
                f"{task!r} is not a dotted path to a function, e.g. 'myapp.tasks.send_mail'."
            )
        return path
    # A Django Tasks Task object wraps the function it runs.
    func = getattr(task, "func", task)
    if not callable(func):
        raise InvalidJob(f"{task!r} is neither a callable nor a dotted path.")
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname:
        raise InvalidJob(f"{task!r} has no module-level name a worker could import.")
    if "<lambda>" in qualname:
        raise InvalidJob("Lambdas cannot be enqueued: define the task as a module-level function.")
    if "<locals>" in qualname:
        raise InvalidJob(
            f"{module}.{qualname} is defined inside a function; workers cannot import it. "
            "Move it to module level."
        )
    if module == "__main__":
        raise InvalidJob(
            f"{qualname} lives in __main__, which workers do not import. "
            "Move it into an importable module."
        )
    return f"{module}.{qualname}"


def resolve(path: str) -> Callable[..., Any]:
    """Import ``path`` (module, then attributes: class methods work too).

    The result may also be a Django Tasks ``Task`` (what ``@task`` makes), which is not
    itself callable but wraps the function in ``.func``; call_job() runs it as a Task.
    """
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this module does not exist" means try a shorter prefix; a missing
            # import *inside* an existing module is a real error to report.
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            raise TaskNotFound(
                f"Importing {module_name!r} for task {path!r} failed: {exc}"
            ) from exc
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise TaskNotFound(
                f"Task {path!r} not found: module {module_name!r} has no "
                f"{'.'.join(parts[split:])!r}."
            ) from None
        if not callable(obj) and not callable(getattr(obj, "func", None)):
            raise TaskNotFound(f"Task {path!r} is not callable.")
        return obj  # type: ignore[no-any-return]
    raise TaskNotFound(f"Task {path!r} not found: no module of that path can be imported.")
