"""The task registry: only what ``@job`` registered (and Django Tasks' ``@task``) ever runs.

A job row names its task by dotted path, and whoever can write a row chooses that path.
So a path is never imported: it is looked up here, in a dict filled by ``@job`` when
a module declaring tasks is imported. Which modules those are is decided by the code,
not by the rows: :func:`discover` imports the ``tasks`` and ``jobs`` modules of every
installed app and the modules listed in ``DBQUEUE['TASK_MODULES']``, once per process.

Django Tasks' ``@task`` objects count as registered: discovery records those of the
modules it imports, and a ``Task`` found under its path in a module that is already
imported is accepted too (read from the module's ``__dict__``: no import, no
``__getattr__``).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import import_module
from typing import Any, TypeVar, Unpack, overload

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob, ScheduleError, UnregisteredTask
from django_dbqueue.options import JobDefaults, check_defaults
from django_dbqueue.scheduling.config import declared_entry
from django_dbqueue.signatures import Parameters
from django_dbqueue.task_names import (
    checked_path_syntax,
    close_paths,
    found_under_own_name,
    is_bound_builtin,
    unimportable_name,
)

F = TypeVar("F", bound=Callable[..., Any])

# Where the Django Tasks framework defines Task: Django 6, and the backport for Django 5.2.
TASK_CLASSES = {("django.tasks.base", "Task"), ("django_tasks.base", "Task")}


def is_framework_task(obj: object) -> bool:
    """Is ``obj`` a Django Tasks ``Task`` (what ``@task`` makes)?

    Checked by class name so that plain jobs never import the framework.
    """
    return any((cls.__module__, cls.__qualname__) in TASK_CLASSES for cls in type(obj).__mro__)


@dataclass(frozen=True)
class RegisteredTask:
    """One entry of the registry: what a worker calls for ``path``."""

    path: str
    func: Any  # a function, or a Django Tasks Task (not itself callable)
    is_framework_task: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)
    # Recurring schedules declared with @job(schedule=...): (name, settings-style entry).
    schedules: tuple[tuple[str, dict[str, Any]], ...] = ()
    # An ``async def`` function: the worker awaits it (worker/executors/asyncio.py).
    is_async: bool = False
    # What enqueue() checks a job's arguments against, read once; None for a Django
    # Task, which the framework checks its own way.
    parameters: Parameters | None = None


_registry: dict[str, RegisteredTask] = {}
# The defaults of a path the registry does not know (one object: enqueue keeps what it
# checked for a task's defaults while they are the same object).
_NO_DEFAULTS: Mapping[str, Any] = types.MappingProxyType({})
_lock = threading.RLock()
_discovered = False
_discovering = False


def unregistered_message(path: str) -> str:
    """Why ``path`` cannot run, with the registered paths closest to it (a misspelling)."""
    close = close_paths(path, list(_registry))
    guess = f"did you mean {' or '.join(map(repr, close))}? If not, " if close else ""
    return (
        f"task {path!r} is not a registered task; {guess}decorate it with @job or list its "
        "module in DBQUEUE['TASK_MODULES']"
    )


# -- @job ------------------------------------------------------------------------------


@overload
def job(func: F, /) -> F: ...


@overload
def job(
    *,
    schedule: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    **defaults: Unpack[JobDefaults],
) -> Callable[[F], F]: ...


def job(
    func: Any = None,
    /,
    *,
    schedule: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    **defaults: Any,
) -> Any:
    """Register a module-level function as a task, under ``module.qualname``.

    ``@job`` or ``@job(queue="emails", max_attempts=5, timeout=30)``: the options
    (``options.JOB_DEFAULTS``) are defaults for every enqueue of this task (an enqueue()
    argument still wins), checked now. The function is returned unchanged: calling it
    directly runs it in the caller.
    ``concurrency_key`` may be a format string over the job's arguments
    (``"customer:{customer_id}"`` from a keyword argument, ``"customer:{0}"`` from the
    first positional one), formatted at each enqueue; see docs/concurrency.md.
    Workers run only registered tasks, so the module must be one they import: an
    installed app's ``tasks.py`` or ``jobs.py``, or a module in ``DBQUEUE['TASK_MODULES']``.

    ``schedule={"cron": "0 3 * * *", "timezone": "Europe/Berlin"}`` (or a list of such)
    also runs it on a schedule: the keys of a ``DBQUEUE['SCHEDULE']`` entry but ``task``,
    plus an optional ``name`` (default: the task's path); see docs/scheduling.md.
    """
    # The queue's existence is checked by enqueue() and by the system checks: settings
    # are not read while modules are being imported.
    checked = check_defaults(defaults)

    def decorate(function: F) -> F:
        entry = register(function, **checked)
        if schedule is not None:
            _registry[entry.path] = replace(
                entry, schedules=_declared_schedules(entry.path, schedule)
            )
        return function

    return decorate if func is None else decorate(func)


def _declared_schedules(
    path: str, given: Mapping[str, Any] | Sequence[Mapping[str, Any]]
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """``@job(schedule=...)`` as (name, entry) pairs, each checked as a settings entry is
    (ScheduleError at import). Time zones are checked here; the default one (Django's
    TIME_ZONE) is applied when the schedules are read."""
    entries = [given] if isinstance(given, Mapping) else list(given)
    declared: list[tuple[str, dict[str, Any]]] = []
    for given_entry in entries:
        name, entry = declared_entry(path, given_entry)
        where = f"@job(schedule=...) on {path}"
        if any(name == other for other, _ in declared):
            raise ScheduleError(
                name, "declared twice on this task: give each schedule its own 'name'.", where=where
            )
        problem = arguments_problem(path, entry.get("args"), entry.get("kwargs"))
        if problem:
            raise ScheduleError(name, problem, "args", where=where)
        declared.append((name, entry))
    return tuple(declared)


def declared_schedules() -> list[tuple[str, str, dict[str, Any]]]:
    """(task path, name, entry) of every ``@job(schedule=...)`` registered so far."""
    return [
        (entry.path, name, schedule)
        for entry in list(_registry.values())
        for name, schedule in entry.schedules
    ]


def register(function: Any, **defaults: Any) -> RegisteredTask:
    """Add ``function`` to the registry (what ``@job`` does); TypeError if it cannot be one."""
    if is_framework_task(function):
        raise TypeError(
            f"{function.module_path} is a Django Tasks task: @task functions are registered "
            "as they are, without @job."
        )
    if not isinstance(function, types.FunctionType):
        raise TypeError(f"@job decorates functions, not {function!r}.")
    if function.__code__.co_flags & 0x200:  # CO_ASYNC_GENERATOR: nothing to await
        raise TypeError(
            f"{function.__qualname__} is an async generator; @job takes functions and "
            "async functions (a job's result is one JSON value)."
        )
    path = f"{function.__module__}.{function.__qualname__}"
    problem = unimportable_name(function.__module__, function.__qualname__)
    if problem:
        raise TypeError(f"@job cannot register {path}: {problem}")
    is_async = bool(function.__code__.co_flags & 0x80)  # CO_COROUTINE: an async def
    checked, parameters = check_defaults(defaults), Parameters(function)
    entry = RegisteredTask(path, function, False, checked, is_async=is_async, parameters=parameters)
    _registry[path] = entry
    return entry


# -- looking tasks up ------------------------------------------------------------------


def registered(path: str) -> RegisteredTask | None:
    """The entry for ``path``, or None; imports nothing and runs no discovery."""
    entry = _registry.get(path)
    if entry is None:
        entry = _framework_task_at(path)
    return entry


def find(path: str) -> RegisteredTask:
    """The entry for ``path``, discovering the task modules first if it is not known yet.

    Raises :class:`UnregisteredTask`. Nothing is imported but the task modules.
    """
    entry = registered(path)
    if entry is None and not _discovered:
        discover()
        entry = registered(path)
    if entry is None:
        raise UnregisteredTask(unregistered_message(path))
    return entry


def resolve(path: str) -> Any:
    """The registered function (or Django Tasks ``Task``) for ``path``; see :func:`find`."""
    return find(path).func


def _framework_task_at(path: str) -> RegisteredTask | None:
    """A Django Tasks ``Task`` under ``path`` in an already imported module, registered.

    Reads module and class ``__dict__``s only, so nothing is imported and no module
    ``__getattr__`` runs.
    """
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if not isinstance(module, types.ModuleType):
            continue
        obj: Any = module
        for name in parts[split:]:
            namespace = vars(obj) if isinstance(obj, types.ModuleType | type) else {}
            obj = namespace.get(name)
            if obj is None:
                break
        if obj is not None and is_framework_task(obj) and obj.module_path == path:
            return _register_framework_task(path, obj)
        return None
    return None


def _register_framework_task(path: str, task: Any) -> RegisteredTask:
    entry = RegisteredTask(path, task, True, {})
    _registry[path] = entry
    return entry


def path_for_enqueue(
    task: Any, validate: bool = True
) -> tuple[str, Mapping[str, Any], Parameters | None]:
    """(task path, the task's registered defaults, the parameters its arguments must fit)
    for what enqueue() was given.

    ``task`` is a registered function, a Django Tasks ``Task`` or its function, or a
    dotted path. Anything else raises InvalidJob, with the reason for the usual
    mistakes (a bound method, a function of ``manage.py shell``). With ``validate``
    off, a path string the registry does not know is accepted as it is (producers
    without the workers' code); workers still run only what their registry knows.
    """
    if type(task) is types.FunctionType:  # the usual case: a registered function
        entry = _registry.get(f"{task.__module__}.{task.__qualname__}")
        if entry is not None:
            return entry.path, entry.defaults, entry.parameters
    elif isinstance(task, str):
        entry = _registry.get(task)
        if entry is not None:
            return entry.path, entry.defaults, entry.parameters
        path = checked_path_syntax(task)
        if not validate:
            entry = registered(path)
            if entry is None:
                return path, _NO_DEFAULTS, None
            return path, entry.defaults, entry.parameters
        entry = find(path)
        return entry.path, entry.defaults, entry.parameters
    if isinstance(task, types.MethodType) or is_bound_builtin(task):
        raise InvalidJob(
            f"{task!r} is a bound method: a job stores its arguments as JSON, never the "
            "object it belongs to. Enqueue a module-level @job function that takes the "
            "object's id, e.g. enqueue(save_order, args=[order.pk])."
        )
    if is_framework_task(task):
        path = task.module_path
        entry = _registry.get(path) or find(path)
        return entry.path, entry.defaults, entry.parameters
    module = getattr(task, "__module__", None)
    qualname = getattr(task, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not callable(task):
        raise InvalidJob(
            f"{task!r} is neither a registered function nor a dotted path; enqueue a "
            "module-level function decorated with @job."
        )
    path = f"{module}.{qualname}"
    entry = _registry.get(path)
    if entry is None:
        problem = unimportable_name(module, qualname)
        if problem:
            raise InvalidJob(f"{path} cannot be enqueued: {problem}")
        if not found_under_own_name(task, module, qualname):
            raise InvalidJob(
                f"{path} cannot be enqueued: {qualname} is not found under that name in "
                f"{module} (defined in a shell such as manage.py shell, or replaced by "
                "another object). Workers look tasks up by module and name: define it in a "
                "module of your app and decorate it with @job."
            )
        entry = find(path)
    return entry.path, entry.defaults, entry.parameters


def arguments_problem(path: str, args: Any, kwargs: Any) -> str:
    """Why the registered task at ``path`` cannot take these arguments ("" when it can,
    or when ``path`` is not a registered function): for schedules, checked ahead."""
    entry = registered(path)
    if entry is None or entry.parameters is None:
        return ""
    try:
        entry.parameters.check(path, args or (), kwargs or {})
    except InvalidJob as exc:
        return str(exc)
    return ""


def task_path(task: Any) -> str:
    """The path under which ``task`` (a registered function, Task or path) is stored."""
    return path_for_enqueue(task)[0]


# -- discovery -------------------------------------------------------------------------


def discover() -> None:
    """Import the modules that declare tasks, once per process.

    The ``tasks`` and ``jobs`` submodules of every installed app (when they exist), then
    ``DBQUEUE['TASK_MODULES']``. An error inside one of them is raised, as the admin's
    autodiscovery does: a worker must not start without its tasks.
    """
    global _discovered, _discovering
    if _discovered:
        return
    with _lock:
        # _discovering: a task module that enqueues while it is imported must not
        # start the discovery again.
        if _discovered or _discovering:
            return
        _discovering = True
        try:
            _import_task_modules()
            _discovered = True
        finally:
            _discovering = False


def _import_task_modules() -> None:
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import module_has_submodule

    for app_config in apps.get_app_configs():
        for name in ("tasks", "jobs"):
            if module_has_submodule(app_config.module, name):
                _record_framework_tasks(import_module(f"{app_config.name}.{name}"))
    for name in settings.TASK_MODULES:
        try:
            module = import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                raise ImproperlyConfigured(
                    f"DBQUEUE['TASK_MODULES'] lists {name!r}, which does not exist."
                ) from exc
            raise
        _record_framework_tasks(module)


def _record_framework_tasks(module: types.ModuleType) -> None:
    """Register the Django Tasks ``Task``s a discovered module declares."""
    for name, value in list(vars(module).items()):
        if is_framework_task(value):
            path = f"{module.__name__}.{name}"
            if value.module_path == path:
                _register_framework_task(path, value)


def all_tasks() -> list[RegisteredTask]:
    """Every registered task after discovery, by path (what a worker would run)."""
    discover()
    return sorted(_registry.values(), key=lambda entry: entry.path)
