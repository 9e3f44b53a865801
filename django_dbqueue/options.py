"""The job options, once: each one's name, default, bound and meaning.

:data:`OPTIONS` is the table every door reads: ``enqueue()`` and ``enqueue_many()``
(which names they take, which are checked once per task and options and which for each
job, the defaults), ``@job`` (which defaults it takes, their bounds), the Tasks
backend's ``DBQueueTask.using()`` and the options it hands to enqueue, the admin's
"Options" fieldset and ``manage.py dbqueue_tasks``' columns. Defaults that come from a
setting name the ``DBQUEUE`` key and are read when a job is enqueued, never at import.

Adding an option is this short list of places:

1. an :class:`Option` in :data:`OPTIONS` (its bound, a function in ``bounds.py``), and
   its type in :class:`EnqueueOptions` (and :class:`JobDefaults` if ``@job`` takes it);
2. its column on ``models.Job`` and a migration, if the job keeps it in a column of
   its own (the admin then shows it);
3. a field of ``tasks.backend.DBQueueTask``, if Django Tasks carry it;
4. for an option checked per job (``scope="job"``) only: what it does to the job, in
   ``enqueueing.build_job`` and ``bulk._Validated.add`` (a ``scope="shared"`` option
   that has a column needs no code: it is checked, defaulted and written by the table);
5. what it changes when the job runs, in the worker or the queue's SQL (for a setting
   ``applied="run"``, where the worker reads it);
6. README.md's options and docs/security.md's limits (docs/tasks.md for a Task field).

``tests/test_options.py`` fails when one of the doors does not take an option of the
table, or the admin does not show it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, TypedDict

from django_dbqueue import bounds
from django_dbqueue.conf import PerSettings, settings
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.signatures import Parameters


@dataclass(frozen=True, slots=True)
class Option:
    """One option of a job, as every door takes it."""

    name: str
    doc: str
    # Bounds a given value; raises InvalidJob. None in a call is "not given": a "shared"
    # option's check is then called with the fallback (the setting, or ``default``), a
    # "job" option's not at all. None here: checked by its own code (run_after needs the
    # moment of enqueue).
    check: Callable[[Any], Any] | None
    # "shared": checked once for the jobs of one enqueue_many() call that name the same
    # task with the same value; "job": checked for each job (it commonly differs).
    scope: Literal["shared", "job"]
    # The DBQUEUE key whose value applies when neither the call nor the task sets it.
    setting: str | None = None
    # When the setting applies: "enqueue" copies its value into the job's column; "run"
    # leaves the column NULL and the worker reads the setting when the job runs.
    applied: Literal["enqueue", "run"] = "enqueue"
    # The value when neither the call, the task nor a setting gives one.
    default: Any = None
    job_default: bool = False  # @job(...) takes it as a default for every enqueue
    many: bool = True  # enqueue_many() takes it
    column: bool = True  # kept in the Job column of the same name
    task_field: str | None = None  # the Django Tasks Task field that carries it


OPTIONS: tuple[Option, ...] = (
    Option(
        "queue",
        "The queue the job waits in; one of DBQUEUE['QUEUES'].",
        bounds.check_queue_name,
        "shared",
        setting="DEFAULT_QUEUE",
        job_default=True,
        task_field="queue_name",
    ),
    Option(
        "priority",
        "Higher runs first, from -32768 to 32767.",
        bounds.check_priority,
        "shared",
        setting="DEFAULT_PRIORITY",
        job_default=True,
        task_field="priority",
    ),
    Option(
        "run_after",
        "When the job may run: an aware datetime, a timedelta or seconds from now.",
        None,  # bounds.run_after_time, with the moment of enqueue
        "job",
        task_field="run_after",
    ),
    Option(
        "max_attempts",
        "Attempts before the job fails for good, from 1 to 1000.",
        bounds.check_max_attempts,
        "shared",
        setting="MAX_ATTEMPTS",
        job_default=True,
        task_field="max_attempts",
    ),
    Option(
        "timeout",
        "Seconds an attempt may run (at most 30 days); none: no limit.",
        bounds.check_timeout,
        "shared",
        setting="JOB_TIMEOUT",
        applied="run",
        job_default=True,
        task_field="timeout",
    ),
    Option(
        "retry_backoff",
        "First retry delay in seconds, doubled per attempt (at most 30 days).",
        bounds.check_retry_backoff,
        "shared",
        setting="RETRY_BACKOFF",
        applied="run",
        job_default=True,
        task_field="retry_backoff",
    ),
    Option(
        "unique_key",
        "While a job of this key waits or runs, enqueue() returns it instead of a new one.",
        bounds.check_unique_key,
        "job",
        many=False,  # one multi-row INSERT cannot skip the rows whose key is taken
        task_field="unique_key",
    ),
    Option(
        "concurrency_key",
        "At most concurrency_limit jobs of this key run at once; in @job, a format "
        "string over the job's arguments.",
        bounds.check_concurrency_key,
        "job",
        job_default=True,
        task_field="concurrency_key",
    ),
    Option(
        "concurrency_limit",
        "How many jobs of the concurrency_key may run at once, from 1 to 1000.",
        bounds.check_concurrency_limit,
        "job",  # checked with the job's key, which it needs
        default=1,  # with a key
        job_default=True,
        task_field="concurrency_limit",
    ),
    Option(
        "depends_on",
        "Jobs (or ids) that must end DONE before this one runs; it waits as WAITING.",
        bounds.check_depends_on,
        "job",
        many=False,  # no multi-row INSERT: enqueue_many() hands it to workflows/graph.py
        column=False,  # the dbqueue_dependency rows
    ),
    Option(
        "on_dependency_failure",
        "With depends_on: 'cancel' (the default) or 'run' when a dependency fails.",
        bounds.check_on_dependency_failure,
        "job",
        default="cancel",
        many=False,
        column=False,  # kept on the dependency rows
    ),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
# What enqueue() takes besides task, args and kwargs, in the table's order.
NAMES: tuple[str, ...] = tuple(BY_NAME)
MANY_NAMES: frozenset[str] = frozenset(o.name for o in OPTIONS if o.many)
SHARED: tuple[Option, ...] = tuple(o for o in OPTIONS if o.scope == "shared")
SHARED_NAMES: frozenset[str] = frozenset(o.name for o in SHARED)
PER_JOB_NAMES: frozenset[str] = frozenset(o.name for o in OPTIONS if o.scope == "job")
JOB_DEFAULTS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.job_default)
COLUMNS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.column)
# Options of a DBQueueTask that the backend hands to enqueue (the framework's own
# fields, queue_name, priority and run_after, it reads itself).
TASK_FIELDS: dict[str, str] = {o.name: o.task_field for o in OPTIONS if o.task_field}


class EnqueueOptions(TypedDict, total=False):
    """The options' types (for type checkers); the keys are :data:`NAMES`."""

    queue: str | None
    priority: int | None
    run_after: datetime | timedelta | float | int | None
    max_attempts: int | None
    timeout: float | None
    retry_backoff: float | None
    unique_key: str | None
    concurrency_key: str | None
    concurrency_limit: int | None
    depends_on: Sequence[Any] | None
    on_dependency_failure: Literal["cancel", "run"] | None


class JobDefaults(TypedDict, total=False):
    """The defaults ``@job`` takes (for type checkers); the keys are :data:`JOB_DEFAULTS`."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    timeout: float | None
    retry_backoff: float | None
    concurrency_key: str | None
    concurrency_limit: int | None


def check_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """The ``@job`` defaults that were set, bounded as enqueue() bounds them (InvalidJob
    if not; TypeError for a name ``@job`` does not take)."""
    bounds.unknown_options("@job", given, JOB_DEFAULTS)
    checked = {}
    for name, value in given.items():
        if value is not None:
            check = BY_NAME[name].check
            checked[name] = value if check is None else check(value)
    return checked


def effective(option: Option, value: Any) -> Any:
    """What a task's ``value`` for ``option`` comes to when its jobs run: the value, else
    the setting it falls back on (at enqueue or at run time), else the option's default."""
    if value is not None:
        return value
    if option.setting:
        return getattr(settings, option.setting)
    return option.default


# -- the options of one call, checked -------------------------------------------------

# (name, check, value when not given) of each shared option: check_options()' plan.
Plan = tuple[tuple[str, Callable[[Any], Any], Any], ...]


class Defaults(NamedTuple):
    """What enqueue reads from the settings, read once per settings object rather than
    per job."""

    queues: frozenset[str]
    plan: Plan
    validate_tasks: bool
    max_payload_bytes: int
    # (task path, backend, given shared options) -> (the task's defaults, Shared): what
    # check_options() found, so a call like an earlier one is not checked again.
    known: dict[tuple[Any, ...], tuple[Mapping[str, Any], Shared]]

    @classmethod
    def read(cls) -> Defaults:
        return _current_defaults()


def _read_defaults() -> Defaults:
    queues = frozenset(settings.QUEUES)

    def known_queue(value: Any) -> str:
        queue = bounds.check_queue_name(value)
        if queue not in queues:
            raise InvalidJob(
                f"Unknown queue {queue!r}. Known queues: {', '.join(sorted(queues))}. "
                "Add it to DBQUEUE['QUEUES'] in your settings."
            )
        return queue

    plan: list[tuple[str, Callable[[Any], Any], Any]] = []
    for option in SHARED:
        check = known_queue if option.name == "queue" else option.check
        assert check is not None, f"the shared option {option.name} has no check"
        fallback = option.default
        if option.setting and option.applied == "enqueue":
            fallback = getattr(settings, option.setting)
        plan.append((option.name, check, fallback))
    return Defaults(
        queues, tuple(plan), bool(settings.VALIDATE_TASKS), int(settings.MAX_PAYLOAD_BYTES), {}
    )


_current_defaults = PerSettings(_read_defaults)


class Shared(NamedTuple):
    """A job's task and shared options, validated: the same for every job of an
    ``enqueue_many()`` call that names the same task with the same options."""

    path: str
    columns: dict[str, Any]  # each shared option's column value
    key_template: str | None  # the task's concurrency_key, formatted per job
    concurrency_limit: Any  # the task's; checked with a job's key
    backend: str
    # The task function's, which each job's arguments must fit (None: not checked here).
    parameters: Parameters | None = None


def check_options(
    path: str,
    task_defaults: Mapping[str, Any],
    defaults: Defaults,
    given: Mapping[str, Any],
    backend: str = "",
    parameters: Parameters | None = None,
) -> Shared:
    """The task at ``path`` with the shared options of ``given`` checked (those left at
    None take the task's ``@job`` defaults, then the ``DBQUEUE`` ones). Raises InvalidJob.

    What was checked is kept per settings: the same task with the same options (by
    exact type and value) is not checked again.
    """
    parts: list[Any] = [path, backend]
    for name, value in given.items():
        if value is not None and name in SHARED_NAMES:
            if type(value) not in _SAME_IF_EQUAL:
                return _check_options(path, task_defaults, defaults, given, backend, parameters)
            parts += (name, type(value), value)
    key = tuple(parts)
    # The task's defaults are the registry's dict, replaced when it is registered again.
    known = defaults.known.get(key)
    if known is not None and known[0] is task_defaults:
        return known[1]
    shared = _check_options(path, task_defaults, defaults, given, backend, parameters)
    if len(defaults.known) >= _KNOWN_MAX:  # e.g. paths the registry does not know
        defaults.known.clear()
    defaults.known[key] = (task_defaults, shared)
    return shared


_KNOWN_MAX = 1000
# Option values whose equality means the same check (exact types: a subclass may define
# its own equality, and True == 1 is a bool where an integer is wanted).
_SAME_IF_EQUAL = frozenset({str, int, float, bool})


def _check_options(
    path: str,
    task_defaults: Mapping[str, Any],
    defaults: Defaults,
    given: Mapping[str, Any],
    backend: str,
    parameters: Parameters | None,
) -> Shared:
    columns = {}
    given_value, task_default = given.get, task_defaults.get  # a task keeps no None default
    for name, check, fallback in defaults.plan:
        value = given_value(name)
        columns[name] = check(task_default(name, fallback) if value is None else value)
    template = task_defaults.get("concurrency_key")
    return Shared(
        path,
        columns,
        None if template is None else str(template),
        task_defaults.get("concurrency_limit"),
        backend,
        parameters,
    )


def shared_attrs(shared: Shared, now: datetime) -> dict[str, Any]:
    """The Job attributes that :class:`Shared` decides (and ``created_at``)."""
    return {
        "task": shared.path,
        **shared.columns,
        "backend": shared.backend,
        "created_at": now,
    }
