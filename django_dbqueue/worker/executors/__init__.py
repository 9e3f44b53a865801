"""How a worker process runs the jobs its core claimed: the executors.

The core (:class:`~django_dbqueue.worker.loop.Worker`) claims jobs and hands them to its
executor; the executor starts them and reports back through the
:class:`~django_dbqueue.worker.recording.Recorder`. Two executors exist:

- :class:`.inline.InlineExecutor` (``run_jobs --threads 1``): each job runs in the
  process's main thread, its timeout from SIGALRM, a cancellation or a second stop
  signal raised from a signal handler;
- :class:`.threads.ThreadedExecutor` (``--threads T``): T threads run jobs side by side,
  a watchdog thread raises timeouts, cancellations and a second stop signal in them;
- :class:`.asyncio.AsyncioExecutor` (``--async-concurrency A``): wraps one of those for
  the sync jobs and runs up to A ``async def`` jobs at once on an event loop.

Running one job, from taking it to recording it, is :meth:`.base.Executor.run`, written once;
an executor supplies only how the job's code is called (:meth:`.base.Executor.call`), how jobs
are handed out and waited for, and what a signal does to a running job.
"""

from __future__ import annotations

import threading

from django_dbqueue.worker.executors.asyncio import AsyncioExecutor
from django_dbqueue.worker.executors.base import Executor
from django_dbqueue.worker.executors.inline import InlineExecutor
from django_dbqueue.worker.executors.threads import ThreadedExecutor
from django_dbqueue.worker.recording import Recorder


def make_executor(
    threads: int,
    recorder: Recorder,
    stopping: threading.Event,
    handle_signals: bool,
    async_concurrency: int = 0,
) -> Executor:
    """The inline executor for one thread, the threaded one for more; with
    ``async_concurrency``, wrapped by the asyncio one for ``async def`` jobs."""
    inner: Executor
    if threads > 1:
        inner = ThreadedExecutor(threads, recorder, stopping, handle_signals)
    else:
        inner = InlineExecutor(recorder, stopping, handle_signals)
    if async_concurrency > 0:
        return AsyncioExecutor(inner, async_concurrency, recorder, stopping, handle_signals)
    return inner
