"""What the worker tells observability beyond the signals: each job's call, wrapped in
the tracing span; what its recorder wrote, for the metrics' :data:`meter`; the outcomes
no signal reports; and which jobs run now.

``worker/execution.call_job`` asks :func:`around` for each job (with tracing off, that
is all it costs). The recorder (``worker/recording.py``) tells :func:`ended` once per
batched write of done jobs, with the starts and run times it keeps anyway, and once for
an attempt that failed, was retried or was cancelled while it ran: the meter counts a
batch at a time, and nothing is called per job for it (a call a job on the job's path
was most of what the metrics cost a no-op job). The worker calls :func:`recorded` where
it records a cancel (before the job started, while it ran, or by killing the process of
a job that ignored it) or a ``RetryJob``. Executors offer the jobs they run now to
:func:`running` (:func:`watch`), read by the metrics once a second. The metrics register
here (:mod:`.metrics`, in the supervisor before it forks, so every child inherits them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django_dbqueue.observability import tracing

if TYPE_CHECKING:
    from django_dbqueue.models import Job

Wrapper = Callable[["Job"], AbstractContextManager[Any]]
Listener = Callable[["Job", str], None]


class Meter(Protocol):
    """The metrics' side of the jobs, told a batch at a time by the recorder: never
    around each job's call (a wrapper cost a context manager a job, a call before and
    after it a few microseconds)."""

    def ended(
        self,
        jobs: Sequence[Job],
        started: Sequence[datetime],
        ran: Sequence[float],
        done: Sequence[Job],
    ) -> None:
        """The calls of ``jobs`` ended (each one's start and run time in seconds, in the
        order of ``jobs``); ``done``: those of them recorded DONE."""


_wrappers: list[Wrapper] = []
_listeners: list[Listener] = []
_running: list[tuple[Callable[[], list[Job]], tuple[str, ...]]] = []
# The metrics' meter (observability/metrics.py), or None.
meter: Meter | None = None


def set_meter(new: Meter | None) -> None:
    global meter
    meter = new


def ended(
    jobs: Sequence[Job], started: Sequence[datetime], ran: Sequence[float], done: Sequence[Job]
) -> None:
    """The calls of ``jobs`` ended: they started at ``started`` and ran
    ``ran`` seconds, in that order; ``done`` of them were recorded DONE. A batched write of
    done jobs (by the worker, or by the supervisor from a dead child's log), or one
    attempt that failed, was retried or was cancelled while it ran."""
    if meter is not None and jobs:
        meter.ended(jobs, started, ran, done)


def watch(source: Callable[[], list[Job]], queues: Sequence[str]) -> None:
    """An executor offers the jobs it runs now, taken from ``queues`` (until
    :func:`unwatch`)."""
    _join(_running, (source, tuple(queues)))


def unwatch(source: Callable[[], list[Job]], queues: Sequence[str]) -> None:
    _leave(_running, (source, tuple(queues)))


def running() -> dict[str, int]:
    """Jobs running now in this process, by queue: every queue a watched executor takes
    from is there, at 0 when it runs none."""
    found = {queue: 0 for _, queues in list(_running) for queue in queues}
    for source, _ in list(_running):
        for job in source():
            found[job.queue] = found.get(job.queue, 0) + 1
    return found


def add(wrapper: Wrapper) -> None:
    _join(_wrappers, wrapper)


def remove(wrapper: Wrapper) -> None:
    _leave(_wrappers, wrapper)


def listen(listener: Listener) -> None:
    _join(_listeners, listener)


def unlisten(listener: Listener) -> None:
    _leave(_listeners, listener)


def _join(members: list[Any], member: Any) -> None:
    if member not in members:
        members.append(member)


def _leave(members: list[Any], member: Any) -> None:
    if member in members:
        members.remove(member)


def recorded(job: Job, outcome: str) -> None:
    """The worker recorded ``outcome`` for ``job`` where no signal reports it: a cancel
    ("cancelled"), or a ``RetryJob`` ("retried")."""
    for listener in _listeners:
        listener(job, outcome)


def around(job: Job) -> AbstractContextManager[Any] | None:
    """What to run the job's call in, or None when nothing wraps it."""
    traced = tracing.recording() is not None
    if not traced:
        if not _wrappers:
            return None
        if len(_wrappers) == 1:
            return _wrappers[0](job)
    return _stacked(job, traced)


@contextmanager
def _stacked(job: Job, traced: bool) -> Iterator[None]:
    """The job's span (outermost), then every registered wrapper."""
    with ExitStack() as stack:
        if traced:
            stack.enter_context(tracing.job_span(job))
        for wrapper in list(_wrappers):
            stack.enter_context(wrapper(job))
        yield
