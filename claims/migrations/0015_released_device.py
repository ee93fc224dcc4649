from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('claims', '0014_object_quota'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReleasedDevice',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('cluster', models.CharField(max_length=63)),
                ('driver', models.CharField(max_length=63)),
                ('pool', models.CharField(max_length=253)),
                ('device', models.CharField(max_length=63)),
                ('woken', models.JSONField(blank=True, default=list)),
            ],
        ),
    ]
