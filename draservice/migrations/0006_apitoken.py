"""API tokens move from the inventory app to the platform. The table keeps its name (``inventory_apitoken``) and
its rows: only Django's idea of which app owns the model changes (and the content type follows, so admin
permissions and log entries stay attached)."""
import django.db.models.deletion
from django.db import migrations, models


def _move_content_type(apps, schema_editor, old, new):
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label=new, model="apitoken").exists():
        content_type.objects.filter(app_label=old, model="apitoken").update(app_label=new)


def forwards(apps, schema_editor):
    _move_content_type(apps, schema_editor, "inventory", "draservice")


def backwards(apps, schema_editor):
    _move_content_type(apps, schema_editor, "draservice", "inventory")


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("draservice", "0005_audit_events"),
        ("inventory", "0006_pool_event_key"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="APIToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name="ID")),
                        ("name", models.CharField(max_length=128)),
                        ("prefix", models.CharField(max_length=16, unique=True)),
                        ("secret_hash", models.CharField(max_length=64)),
                        ("kind", models.CharField(choices=[("admin", "admin"), ("cluster", "cluster"),
                                                           ("namespace", "namespace")], max_length=16)),
                        ("namespaces", models.JSONField(blank=True, default=list)),
                        ("read_only", models.BooleanField(default=False)),
                        ("expires_at", models.DateTimeField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        ("cluster", models.ForeignKey(blank=True, null=True,
                                                      on_delete=django.db.models.deletion.CASCADE,
                                                      related_name="tokens", to="inventory.cluster")),
                    ],
                    options={
                        "db_table": "inventory_apitoken",
                        "ordering": ["id"],
                        "constraints": [models.CheckConstraint(
                            condition=models.Q(models.Q(("cluster__isnull", False), ("kind", "cluster")),
                                               models.Q(("kind", "cluster"), _negated=True), _connector="OR"),
                            name="inventory_token_cluster_has_cluster")],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
