from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evals", "0005_item_keys"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="datasetitem",
            constraint=models.UniqueConstraint(fields=("version", "key"), name="datasetitem_key_unique"),
        ),
        migrations.AddConstraint(
            model_name="runitem",
            constraint=models.UniqueConstraint(fields=("run", "key"), name="runitem_key_unique"),
        ),
    ]
