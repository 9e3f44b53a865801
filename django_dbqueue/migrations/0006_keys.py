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
    ]
