from django.db import models


class Execution(models.Model):
    """A row per run of the test jobs, so tests can count runs across processes."""

    key = models.CharField(max_length=100, db_index=True)
    pid = models.IntegerField()
    attempt = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.key} (pid {self.pid})"
