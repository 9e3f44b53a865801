from django.db import migrations, models


class Migration(migrations.Migration):
    # The lead renumbers this at merge.
    dependencies = [
        ("django_dbqueue", "0013_workerprocess_plural"),
    ]

    operations = [
        # Nullable, in no index: adding it rewrites nothing (MariaDB INSTANT, PostgreSQL).
        migrations.AddField(
            model_name="workerprocess",
            name="clock_offset",
            field=models.FloatField(
                blank=True,
                help_text="Seconds the database's clock was ahead of this host's at the last "
                "heartbeat (negative: behind). The queue uses the database's clock only.",
                null=True,
            ),
        ),
    ]
