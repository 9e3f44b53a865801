"""The app's configuration: system checks and signal receivers are wired in ready()."""

from django.apps import AppConfig


class DBQueueConfig(AppConfig):
    name = "django_dbqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_dbqueue import checks, signals, tasks
        from django_dbqueue.queue import announce

        checks.register()
        for switched in (signals.queues_paused, signals.queues_resumed):
            switched.connect(announce.on_queues_switched, dispatch_uid="django_dbqueue.switched")
        if tasks.framework_available():
            tasks.ready()
