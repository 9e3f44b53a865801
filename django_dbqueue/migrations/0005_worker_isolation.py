from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0004_job_task_options"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="role",
            field=models.CharField(
                choices=[("supervisor", "Supervisor"), ("child", "Child"), ("worker", "Worker")],
                default="worker",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="supervisor",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Name of the supervisor of a child.",
                max_length=255,
            ),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="running_job_id",
            field=models.BigIntegerField(
                blank=True,
                help_text="The job it is running (once it has run for a moment).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="running_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
