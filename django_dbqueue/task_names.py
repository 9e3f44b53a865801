"""How a task is named for workers: whether a function or a dotted path can be found by name.

A worker finds a task by its dotted path, in a registry filled by imports, never by
importing what a row names. These checks tell, before anything is stored, why a given
function (a lambda, a nested function, one of ``__main__`` or of a shell, a bound
method) or string could never be found that way.
"""

from __future__ import annotations

import difflib
import sys
import types
from typing import Any

from django_dbqueue.exceptions import InvalidJob

PATH_MAX = 255  # Job.task's max_length


def unimportable_name(module: str, qualname: str) -> str:
    """Why a worker could never find a function of this name ("" when it could)."""
    if "<lambda>" in qualname:
        return "lambdas have no name a worker could look up; define a module-level function."
    if "<locals>" in qualname:
        return (
            "it is defined inside a function, so workers cannot find it; move it to module level."
        )
    if module == "__main__":
        return (
            f"{qualname} is defined in __main__ (a script or an interactive session), which "
            "workers never import; move it into a module of your app, e.g. myapp/jobs.py."
        )
    return ""


def is_bound_builtin(task: Any) -> bool:
    owner = getattr(task, "__self__", None)
    return isinstance(task, types.BuiltinMethodType) and not (
        owner is None or isinstance(owner, types.ModuleType)
    )


def found_under_own_name(function: Any, module_name: str, qualname: str) -> bool:
    """Is ``function`` what its module holds under its qualname (without importing)?"""
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType):
        return False
    obj: Any = module
    for name in qualname.split("."):
        namespace = vars(obj) if isinstance(obj, types.ModuleType | type) else {}
        obj = namespace.get(name)
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
    while obj is not None and obj is not function:
        obj = getattr(obj, "__wrapped__", None) if isinstance(obj, types.FunctionType) else None
    return obj is function


def checked_path_syntax(task: str) -> str:
    path = task.strip()
    if not path or "." not in path or any(not part.isidentifier() for part in path.split(".")):
        raise InvalidJob(
            f"{task[:100]!r} is not a dotted path to a task, e.g. 'myapp.jobs.send_mail'."
        )
    if len(path) > PATH_MAX:
        raise InvalidJob(f"a task path is at most {PATH_MAX} characters long.")
    return path


def close_paths(path: str, known: list[str]) -> list[str]:
    """The paths of ``known`` closest to a misspelt ``path`` (at most 3, best first):
    close as a whole and in the function's own name, since the paths of one module
    share most of their letters."""
    name = path.rpartition(".")[2]
    return [
        other
        for other in difflib.get_close_matches(path, known, n=3, cutoff=0.8)
        if difflib.SequenceMatcher(None, name, other.rpartition(".")[2]).ratio() >= 0.8
    ]
