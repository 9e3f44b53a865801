from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0011_job_trace_context"),
    ]

    operations = [
        # The galera lock backend's rows (locks/galera.py); an empty table elsewhere.
        migrations.CreateModel(
            name="LockLease",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("owner", models.CharField(max_length=32)),
                ("expires_at", models.DateTimeField()),
            ],
            options={"db_table": "dbqueue_lock"},
        ),
    ]
