"""Workflows: jobs that wait for other jobs, chains and groups, batches with callbacks,
and cluster-wide rate limits (docs/workflows.md).

The public names: ``enqueue(..., depends_on=[...], on_dependency_failure=...)``,
``django_dbqueue.enqueue_batch``, :mod:`.chains` (``chain``, ``group``), :mod:`.graph`
(``item``: ``enqueue_many`` items that wait for items of the same call),
:mod:`.results` (``dependency_results``, ``previous_result``) and
``DBQUEUE["RATE_LIMITS"]`` (per queue, or ``"key:NAME"`` per concurrency key). The SQL
of the state changes lives in the queue room (``queue/dependents.py``,
``queue/batches.py``, ``queue/ratelimits.py``).
"""
