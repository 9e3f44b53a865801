"""The worker room: the loop that runs jobs, the supervisor over its processes, helpers."""
