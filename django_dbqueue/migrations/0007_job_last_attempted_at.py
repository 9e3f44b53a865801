from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0006_keys"),
    ]

    operations = [
        # Nullable, in no index: adding it rewrites nothing on MariaDB 10.3+ (INSTANT)
        # and PostgreSQL, and finishing a first attempt does not write it.
        migrations.AddField(
            model_name="job",
            name="last_attempted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
