from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("draservice", "0004_webhook_secrets")]

    operations = [
        migrations.CreateModel(
            name="AuditEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("at", models.DateTimeField()),
                ("actor", models.CharField(max_length=160)),
                ("actor_kind", models.CharField(max_length=16)),
                ("kind", models.CharField(max_length=63)),
                ("name", models.CharField(max_length=253)),
                ("operation", models.CharField(max_length=16)),
                ("changes", models.JSONField(default=list)),
            ],
            options={"ordering": ["id"],
                     "indexes": [models.Index(fields=["kind", "name", "id"], name="draservice_audit_object")]},
        ),
    ]
