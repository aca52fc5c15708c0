"""``Attempt.return_value``'s help text: every handler's return value is kept, not only a
django.tasks task's, and a workflow step's reaches its children. No change to any table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduler_core', '0024_attempt_base'),
    ]

    operations = [
        migrations.AlterField(
            model_name='attempt',
            name='return_value',
            field=models.JSONField(blank=True, help_text="What the handler returned (JSON, size-bounded). A job's result, and a workflow step's value in its children's ctx.parent_results, is that of the attempt whose completion was accepted.", null=True),
        ),
    ]
