"""Signals sent by the queue. Receivers run in the sending process.

Those sent for every job or claim (sender=Job) keep their receivers per sender
(``use_caching``; connecting or disconnecting a receiver empties it): a worker sends two
for each job it runs, and without the cache each send filters the receivers anew.
"""

from django.dispatch import Signal

# sender=Job, jobs=list[Job]; sent once the enqueueing transaction has committed.
jobs_enqueued = Signal(use_caching=True)
# sender=Job, jobs=Claimed (a list, empty when nothing was taken), worker=str; sent by
# Job.objects.claim() after each claim (the worker's metrics count claims with it).
jobs_claimed = Signal(use_caching=True)
# sender=Job, job=Job, worker=str; sent in the worker before the job runs.
job_started = Signal(use_caching=True)
# sender=Job, job=Job, worker=str, result=Any; after the job returned and was recorded.
job_finished = Signal(use_caching=True)
# sender=Job, job=Job, worker=str, exception=BaseException, will_retry=bool.
job_failed = Signal(use_caching=True)
# sender=QueueState, queues=list[str]; sent on commit when running queues are paused.
queues_paused = Signal()
# sender=QueueState, queues=list[str]; sent on commit when paused queues are resumed.
queues_resumed = Signal()
# sender=None, where=str; a write that met a conflict (deadlock, lock wait timeout, a
# lost Galera certification) and will be retried (queue/conflicts.note_conflict).
conflict_retried = Signal()
