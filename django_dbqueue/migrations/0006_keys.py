from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0005_worker_isolation"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="origin_unique_key",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.CreateModel(
            name="ConcurrencyKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=255, unique=True)),
                ("parked", models.BooleanField(db_index=True, default=False)),
            ],
            options={
                "db_table": "dbqueue_concurrency",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["concurrency_key", "id"], name="dbq_job_concurrency"),
        ),
    ]
