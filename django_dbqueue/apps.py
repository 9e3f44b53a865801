from django.apps import AppConfig


class DBQueueConfig(AppConfig):
    name = "django_dbqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported for their side effects: system checks and the wake-up signal receiver.
        from django_dbqueue import checks, wakeup  # noqa: F401
