from django.apps import AppConfig


class DBQueueConfig(AppConfig):
    name = "django_dbqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_dbqueue import checks  # noqa: F401  (registers the system checks)
