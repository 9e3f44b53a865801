"""The tables: jobs, the worker processes that run them, and counters for the locks."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, ClassVar

from django.db import models
from django.db.models import QuerySet
from django.utils import timezone

from django_dbqueue.queue.manager import JobManager
from django_dbqueue.status import FINISHED, JobStatus


class Job(models.Model):
    """One unit of work: a row is enqueued, claimed by a worker, run and finished."""

    Status = JobStatus
    FINISHED: ClassVar[tuple[str, ...]] = FINISHED

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=64, default="default")
    task = models.CharField(max_length=255, help_text="Dotted path of the callable to run.")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first.")
    run_after = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    timeout = models.FloatField(null=True, blank=True, help_text="Seconds; empty = no limit.")
    retry_backoff = models.FloatField(
        null=True, blank=True, help_text="First retry delay in seconds; empty = global setting."
    )
    # Set while a job waits or runs; cleared when it finishes so the key can be reused.
    unique_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    # The unique_key the job was enqueued with, never cleared: what a requeue gives back.
    # Written once at insert, in no index, so finishing a job costs nothing more. NULL,
    # like unique_key, means "enqueued without a key" ("" would be a key).
    origin_unique_key = models.CharField(  # noqa: DJ001
        max_length=255, null=True, blank=True, editable=False
    )
    # At most concurrency_limit jobs of one concurrency_key are claimed at any moment
    # (docs/concurrency.md): the claim counts CLAIMED rows of the key under a lock on the
    # key's ConcurrencyKey row, so every way a job leaves CLAIMED frees its slot.
    concurrency_key = models.CharField(  # noqa: DJ001 (NULL: no key; "" would be a key)
        max_length=255, null=True, blank=True
    )
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    backend = models.CharField(
        max_length=64, blank=True, default="", help_text="Django Tasks backend alias, if any."
    )
    # Django Tasks: the enqueued Task's options that the columns do not keep as given
    # (run_after, an explicit max_attempts, unique_key after it is cleared...), where they
    # differ from the task's declaration, so get_result() returns the Task that was enqueued.
    task_options = models.JSONField(null=True, blank=True, editable=False)
    # The W3C traceparent of the span that enqueued the job, when OpenTelemetry is in use:
    # the worker's span for the job links to it (docs/observability.md). NULL: no trace.
    trace_context = models.CharField(  # noqa: DJ001 (NULL: no trace, "" is no traceparent)
        max_length=55, null=True, blank=True, editable=False
    )
    # Workflows (docs/workflows.md). ``workflow``: the job has dependents or belongs to a
    # batch, so its finish also releases dependents and counts it in its batch (in the
    # same transaction); plain jobs keep the one-statement finish. ``batch_id``: its
    # batch; ``batch_counted``: its end is in the batch's counters (once, even when an
    # operator requeues it). Written at insert, or (``workflow``) when a dependent is
    # enqueued: in no index, so they cost the claim and the finish nothing.
    workflow = models.BooleanField(default=False, editable=False)
    batch_id = models.BigIntegerField(null=True, blank=True, editable=False)
    batch_counted = models.BooleanField(default=False, editable=False)
    owner = models.CharField(max_length=255, blank=True, default="")
    owner_date = models.DateTimeField(
        null=True, blank=True, help_text="When the owner last claimed or renewed its lease."
    )
    cancel_requested = models.BooleanField(default=False)
    result = models.JSONField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    errors = models.JSONField(
        default=list, blank=True, help_text="Errors of earlier attempts, newest last."
    )
    created_at = models.DateTimeField(default=timezone.now)
    # The first attempt's start (written only while NULL), and the latest attempt's when
    # it is not the first (NULL: the first attempt is the latest). Written with the
    # attempt's outcome, or by the supervisor once an attempt has run a moment.
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobManager()

    class Meta:
        db_table = "dbqueue_job"
        indexes = [
            # The claim query, column for column: WHERE status, queue, run_after <= now
            # ORDER BY priority DESC, run_after, id. InnoDB locks what it scans, so
            # this index must match exactly.
            models.Index(
                fields=["status", "queue", "-priority", "run_after", "id"],
                name="dbq_job_claim",
            ),
            # Claimed rows are few (workers x batch size): heartbeats and give-back go by
            # primary key, and lease recovery (status = claimed, owner_date < cutoff) reads
            # the claimed prefix of the claim index. No index of its own, so claiming and
            # finishing write two secondary indexes, not four.
            # History: failures since, throughput per minute, purging old rows.
            models.Index(fields=["status", "finished_at"], name="dbq_job_finished"),
            # Admin: one queue's or one task's jobs, newest first. Without status in them,
            # these never change after the INSERT, so they cost the hot path nothing; a
            # status filter on top reads a queue's rows newest first until the page is full.
            models.Index(fields=["queue", "id"], name="dbq_job_queue"),
            # The claim counts a key's CLAIMED rows along this one. Neither column changes
            # after the INSERT, so status changes of jobs without a key never write it.
            models.Index(fields=["concurrency_key", "id"], name="dbq_job_concurrency"),
            models.Index(fields=["task", "id"], name="dbq_job_task"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.task} [{self.status}]"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    def refresh_status(self) -> str:
        self.refresh_from_db(fields=["status"])
        return self.status

    def refresh_from_db(
        self,
        using: str | None = None,
        fields: Iterable[str] | None = None,
        from_queryset: QuerySet[Job] | None = None,
    ) -> None:
        """Re-read (a deferred field too) from the database this job was read from: the
        worker's jobs come from the primary, and a router whose ``db_for_read`` ignores
        the instance would send the read to a replica that may not have the row yet."""
        if using is None and from_queryset is None:
            using = self._state.db
        super().refresh_from_db(using=using, fields=fields, from_queryset=from_queryset)

    def as_call(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.task, list(self.args or []), dict(self.kwargs or {})

    def note_attempt(self, started: datetime) -> None:
        """An attempt starts at ``started``: the first one's start goes to ``started_at``
        (kept from then on), a later one's to ``last_attempted_at``."""
        if self.started_at is None:
            self.started_at = started
        else:
            self.last_attempted_at = started

    @property
    def attempt_started_at(self) -> datetime | None:
        """When the latest attempt started (None before the first)."""
        return self.last_attempted_at or self.started_at


class WorkerProcess(models.Model):
    """A process of ``run_jobs``: a supervisor, or one of its children that run the jobs.

    The supervisor writes every row of its host's processes (``heartbeat_at`` while they
    live, the running job once it has run for a moment); lease recovery reads
    ``running_job_id`` to tell the job a dead worker was running from those it had not
    started.
    """

    class Role(models.TextChoices):
        SUPERVISOR = "supervisor"
        CHILD = "child"  # runs jobs under a supervisor
        WORKER = "worker"  # runs jobs in-process, unsupervised (Worker.run() called directly)

    name = models.CharField(max_length=255, unique=True)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.WORKER)
    supervisor = models.CharField(
        max_length=255, blank=True, default="", help_text="Name of the supervisor of a child."
    )
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now, db_index=True)
    jobs_done = models.PositiveBigIntegerField(default=0)
    jobs_failed = models.PositiveBigIntegerField(default=0)
    stopping = models.BooleanField(default=False)
    running_job_id = models.BigIntegerField(
        null=True, blank=True, help_text="The job it is running (once it has run for a moment)."
    )
    running_since = models.DateTimeField(null=True, blank=True)
    clock_offset = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds the database's clock was ahead of this host's at the last "
        "heartbeat (negative: behind). The queue uses the database's clock only.",
    )

    class Meta:
        db_table = "dbqueue_worker"
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return self.name


class Counter(models.Model):
    """A named integer, for fencing tokens and wrap-around id counters."""

    name = models.CharField(max_length=255, primary_key=True)
    value = models.BigIntegerField(default=0)

    class Meta:
        db_table = "dbqueue_counter"

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class LockLease(models.Model):
    """A named lock's holder and lease, for the galera lock backend (locks/galera.py):
    conflicting writes of this row on two nodes are refused by certification."""

    name = models.CharField(max_length=64, primary_key=True)
    owner = models.CharField(max_length=32)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "dbqueue_lock"

    def __str__(self) -> str:
        return f"{self.name} held by {self.owner} until {self.expires_at}"


class QueueState(models.Model):
    """An operator's switch per queue: a paused queue keeps its jobs but nobody claims them."""

    name = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(default=False)
    changed_at = models.DateTimeField(default=timezone.now)
    changed_by = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        db_table = "dbqueue_queue"

    def __str__(self) -> str:
        return f"{self.name} ({'paused' if self.paused else 'running'})"


class ScheduleTick(models.Model):
    """One tick of a recurring schedule, enqueued once: the unique (schedule, tick_at) pair
    is what makes many schedulers on many hosts enqueue each tick exactly once."""

    schedule = models.CharField(max_length=200)
    tick_at = models.DateTimeField()
    # Not a foreign key: retention deletes old jobs, the tick stays as the schedule's memory.
    job_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "dbqueue_schedule_tick"
        constraints = [
            models.UniqueConstraint(fields=["schedule", "tick_at"], name="dbq_tick_once"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.tick_at.isoformat()}"


class Duty(models.Model):
    """A cluster-wide periodic duty (pruning): whoever moves ``due_at`` forward does it, so
    it runs at most once per interval however many workers there are."""

    name = models.CharField(max_length=64, primary_key=True)
    due_at = models.DateTimeField()
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_result = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        db_table = "dbqueue_duty"

    def __str__(self) -> str:
        return f"{self.name} (due {self.due_at.isoformat()})"


class ConcurrencyKey(models.Model):
    """One row per concurrency key: the lock that serializes claims of the key's jobs.

    No counter: the jobs holding a key's slots are its CLAIMED rows. ``parked`` says some
    of its jobs wait for a slot (their run_after is PARKED_UNTIL); claims look for them.
    """

    key = models.CharField(max_length=255, unique=True)
    parked = models.BooleanField(default=False, db_index=True)

    class Meta:
        db_table = "dbqueue_concurrency"

    def __str__(self) -> str:
        return self.key


class Dependency(models.Model):
    """``job`` waits for ``depends_on`` (docs/workflows.md). Ids, not foreign keys:
    retention and operators delete jobs; a missing dependency counts as cancelled.

    ``satisfied`` is set, under a lock on the waiting job's row, when the dependency
    finished DONE (or ended otherwise and the job runs anyway): the job becomes QUEUED
    when none of its edges is left unsatisfied.
    """

    job_id = models.BigIntegerField()
    depends_on_id = models.BigIntegerField(db_index=True)
    satisfied = models.BooleanField(default=False)
    run_on_failure = models.BooleanField(default=False)  # on_dependency_failure="run"

    class Meta:
        db_table = "dbqueue_dependency"
        constraints = [
            models.UniqueConstraint(fields=["job_id", "depends_on_id"], name="dbq_dep_once"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} after #{self.depends_on_id}"


class Batch(models.Model):
    """A batch of jobs and its callbacks (docs/workflows.md).

    Members' ends are counted in :class:`BatchCounter` shards (one row write per member
    finish, spread so concurrent finishes do not queue on one row). ``completed_at`` is
    set once, by a conditional UPDATE: whoever sets it enqueues the callbacks, in the
    same transaction, so they exist exactly once.
    """

    total = models.PositiveIntegerField(default=0)
    closed = models.BooleanField(default=False)
    # The callbacks' validated job fields ({"on_complete": {...}, ...}).
    callbacks = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    callback_ids = models.JSONField(default=list, blank=True)

    class Meta:
        db_table = "dbqueue_batch"
        verbose_name_plural = "batches"
        # Retention deletes completed batches oldest first (queue/batches.py).
        indexes = [models.Index(fields=["completed_at", "id"], name="dbq_batch_completed")]

    def __str__(self) -> str:
        return f"batch #{self.pk}"


class BatchCounter(models.Model):
    """One shard of a batch's counts of finished members."""

    batch_id = models.BigIntegerField()
    shard = models.PositiveSmallIntegerField()
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "dbqueue_batch_counter"
        constraints = [
            models.UniqueConstraint(fields=["batch_id", "shard"], name="dbq_batch_shard"),
        ]

    def __str__(self) -> str:
        return f"batch #{self.batch_id} shard {self.shard}"


class RateSlot(models.Model):
    """One of a rate limit's ``limit`` start slots (docs/workflows.md): a claim takes a
    slot last used more than ``period`` ago (SKIP LOCKED) for each job it starts, so
    no window of ``period`` holds more than ``limit`` starts, with no lock held beyond
    the claim's short transaction."""

    key = models.CharField(max_length=255)
    slot = models.PositiveIntegerField()
    used_at = models.DateTimeField()

    class Meta:
        db_table = "dbqueue_rate_slot"
        constraints = [
            models.UniqueConstraint(fields=["key", "slot"], name="dbq_rate_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.key}[{self.slot}]"
