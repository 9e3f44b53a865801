from django.db import migrations, models


class Migration(migrations.Migration):
    # The lead re-points this at 0010 (issue #25's migration) when merging.
    dependencies = [
        ("django_dbqueue", "0010_mysql_exact_keys"),
    ]

    operations = [
        # Nullable, in no index: adding it rewrites nothing on MariaDB 10.3+ (INSTANT)
        # and PostgreSQL; a job enqueued without a trace leaves it NULL and unnamed in
        # the INSERT (queue/insert.py).
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.CharField(blank=True, editable=False, max_length=55, null=True),
        ),
    ]
