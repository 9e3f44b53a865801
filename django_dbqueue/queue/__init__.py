"""The queue's SQL: one module per state change, vendor differences in :mod:`.dialects`.

``Job.objects`` (:mod:`.manager`) is the way in; the modules below it take the model and
the database alias and run short transactions that never span a job's execution.
"""
