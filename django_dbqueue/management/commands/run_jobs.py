"""``manage.py run_jobs``: the worker command, a thin shell over :mod:`django_dbqueue.worker`."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import InterfaceError, OperationalError, connections, router

from django_dbqueue import registry, tasks
from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue.dialects import server_address
from django_dbqueue.queue.schema import schema_problem
from django_dbqueue.worker.connections import CONNECTIONS_WARNING, backoff, budget
from django_dbqueue.worker.handout import hands_out
from django_dbqueue.worker.progress import Progress
from django_dbqueue.worker.supervisor import Supervisor

logger = logging.getLogger("django_dbqueue.worker")


def whole_number(value: str, least: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {number}")
    return number


def positive_int(value: str) -> int:
    return whole_number(value, 1)


def non_negative_int(value: str) -> int:
    return whole_number(value, 0)


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return number


def add_concurrency_arguments(parser: CommandParser) -> None:
    """How many jobs run at once: processes, threads in each, async jobs in each."""
    parser.add_argument(
        "--concurrency",
        "-c",
        type=positive_int,
        default=1,
        help="Worker processes to run under the supervisor (default 1).",
    )
    parser.add_argument(
        "--threads",
        "-t",
        type=positive_int,
        default=1,
        help="Jobs each process runs at once, in threads, for I/O-bound jobs (default 1; "
        "see docs/reliability.md for what changes).",
    )
    parser.add_argument(
        "--async-concurrency",
        "-a",
        type=non_negative_int,
        default=None,
        help="async def jobs each process runs at once on an event loop, beside its "
        "other jobs (default DBQUEUE['ASYNC_CONCURRENCY']; 0: each async job on its own "
        "in the process's thread(s); see docs/async.md).",
    )


class Command(BaseCommand):
    help = "Run queued jobs: claim them in batches, run them, record the results."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Queue to take jobs from; repeat for several (default: all "
            "queues in DBQUEUE['QUEUES']).",
        )
        add_concurrency_arguments(parser)
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="Jobs claimed per transaction (default DBQUEUE['BATCH_SIZE']).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit once no job is runnable instead of waiting for more.",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            default=None,
            help="Exit after this many jobs (across all processes).",
        )
        parser.add_argument(
            "--metrics-port",
            type=positive_int,
            default=None,
            help="Serve this host's worker metrics for Prometheus on this port "
            "(default DBQUEUE['METRICS_PORT']; needs prometheus_client: "
            "docs/observability.md).",
        )
        parser.add_argument(
            "--progress-interval",
            type=positive_float,
            default=2.0,
            help="Seconds between progress lines (default 2).",
        )

    def execute(self, *args: Any, **options: Any) -> Any:
        # First thing: a stop signal from here on ends the start cleanly (EarlyStop).
        self.early_stop = EarlyStop()
        try:
            return super().execute(*args, **options)
        finally:
            self.early_stop.restore()

    def check(self, *args: Any, **kwargs: Any) -> None:
        # Django 6.1 runs the database-specific model checks before every command, and on
        # MySQL they connect: a database that is down for now would stop the worker with
        # a traceback instead of being retried like an outage later on.
        try:
            super().check(*args, **kwargs)
        except (OperationalError, InterfaceError):
            pass

    def handle(self, *args: Any, **options: Any) -> None:
        queues: list[str] = options["queues"] or list(settings.QUEUES)
        unknown = [q for q in queues if q not in settings.QUEUES]
        if unknown:
            raise CommandError(
                f"Unknown queue(s): {', '.join(unknown)}. Known: {', '.join(settings.QUEUES)} "
                "(DBQUEUE['QUEUES'])."
            )
        alias = router.db_for_write(Job)
        self._wait_for_database(alias)
        try:
            problem = schema_problem(alias)
        except (OperationalError, InterfaceError):
            # Gone again already: the worker retries until it is back, as it does later.
            problem = None
        if problem:
            raise CommandError(problem)
        # Before the first job, and before forking: a broken task module stops the start,
        # and every worker process inherits the registry.
        registry.discover()
        verbosity = int(options["verbosity"])
        if verbosity >= 2:
            logging.getLogger("django_dbqueue").setLevel(logging.DEBUG)
        if tasks.framework_available():
            tasks.log_task_states(self.stdout, verbosity)
        progress = Progress(self.stdout.write, options["progress_interval"]) if verbosity else None
        async_lanes = self.async_lanes(options["async_concurrency"])
        worker_options: dict[str, Any] = {
            "queues": queues,
            "batch_size": options["batch_size"],
            "burst": options["burst"],
            "max_jobs": options["max_jobs"],
            "threads": options["threads"],
            "async_concurrency": async_lanes,
        }
        concurrency: int = options["concurrency"]
        self.announce(progress is not None, queues, concurrency, options, async_lanes)
        # Before the children are forked: they inherit the metrics and count into the
        # run's directory, which the supervisor's server reads.
        server = metrics_server(options["metrics_port"] or settings.METRICS_PORT)
        try:
            # Always a supervisor, even for one process: jobs run in a child that the
            # supervisor can kill and replace, and whose leases no job's code can stall.
            early = self.early_stop
            try:
                stats = Supervisor(concurrency, worker_options, progress, lambda: early.count).run()
            except (OperationalError, InterfaceError) as exc:
                # Told to stop while the database is away: one line, exit 1.
                raise CommandError(f"stopped with the database unreachable: {exc}") from None
            if progress is not None:
                progress.update(stats, force=True)
                self.stdout.write(progress.summary(stats))
        finally:
            if server is not None:
                server.close()  # last: a final scrape still sees the whole run

    def announce(
        self,
        verbose: bool,
        queues: list[str],
        concurrency: int,
        options: dict[str, Any],
        lanes: int,
    ) -> None:
        """The first lines: what runs, and the connections it opens (a warning when they
        take most of the server's max_connections)."""
        if verbose:
            mode = "burst" if options["burst"] else "waiting for jobs"
            threads = f" x {options['threads']} threads" if options["threads"] > 1 else ""
            threads += f" + {lanes} async" if lanes else ""
            self.stdout.write(
                f"Running jobs from {', '.join(queues)} with {concurrency} "
                f"process(es){threads}, {mode}. Ctrl-C to stop."
            )
        planned = budget(concurrency, int(options["threads"] or 1), hands_out(concurrency))
        if verbose:
            self.stdout.write(planned.line())
        if planned.too_many():
            logging.getLogger("django_dbqueue.supervisor").warning(
                "%s That is over %d%% of max_connections, before any other host or the "
                "app's own processes: lower --concurrency/--threads, or raise max_connections.",
                planned.line(),
                int(CONNECTIONS_WARNING * 100),
            )

    def _wait_for_database(self, alias: str) -> None:
        """Connect before anything else, saying each retry in one line (which database,
        where, why) while it is unreachable; a stop signal meanwhile exits 1 at once."""
        conn, failures = connections[alias], 0
        while True:
            try:
                conn.ensure_connection()
                return
            except (OperationalError, InterfaceError) as exc:
                failures += 1
                wait = backoff(failures)
                reason = (
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                )
                self.stderr.write(
                    f"database {alias!r} at {server_address(conn)} is unreachable ({reason}); "
                    f"retrying in {wait:.1f} s"
                )
                conn.close()
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if self.early_stop.count:
                    raise SystemExit(1)
                time.sleep(0.05)

    def async_lanes(self, given: int | None) -> int:
        """--async-concurrency, else the setting; a note when async jobs would wait."""
        lanes = int(settings.ASYNC_CONCURRENCY) if given is None else given
        if not lanes and any(entry.is_async for entry in registry.all_tasks()):
            logger.info(
                "Async @job functions run one at a time per thread: pass "
                "--async-concurrency N to await N at once (docs/async.md)."
            )
        return lanes


def metrics_server(port: int | None) -> Any:
    """The running metrics server (observability/metrics.py), or None without a port
    (dbqueue_bench --metrics-port serves it around its drains too)."""
    if not port:
        return None
    try:
        # Imported only when asked for: prometheus_client is an optional extra.
        from django_dbqueue.observability import metrics
    except ImportError as exc:
        raise CommandError(
            f"--metrics-port needs prometheus_client ({exc}): "
            "pip install 'django-dbqueue[metrics]'."
        ) from None
    try:
        return metrics.Server(int(port), str(settings.METRICS_ADDRESS))
    except OSError as exc:
        raise CommandError(f"Cannot serve metrics on port {port}: {exc}") from None


class EarlyStop:
    """Stop signals that come while ``run_jobs`` starts (its checks, the discovery of the
    task modules), before the supervisor has its handlers: counted, and passed on to it,
    which then starts no child and exits 0. Without it, such a signal ended the process
    with -15. A second one ends the start at once (exit 1)."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            raise SystemExit(1)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
