"""Management commands: thin shells over the worker, queue and scheduling rooms."""
