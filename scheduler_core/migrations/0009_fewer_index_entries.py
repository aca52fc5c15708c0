"""Fewer index entries per job version: every claim and completion writes a new version of
the job's row, and each version costs one entry in every index of the table (none of which a
vacuum can remove while an older snapshot is held). The unique key and the schedule are
indexed only where set (most jobs have neither), the text-pattern index Django adds to a
unique text column goes (no query matches keys by prefix), and the attempt table's index on
its job goes (its unique (job, fence) index serves every lookup by job).

The new unique index is built before the old constraint is dropped, in the same transaction,
so no moment allows a duplicate key. On PostgreSQL building it holds off inserts into the job
table while it reads the keys set (docs/operations.md, "Upgrading")."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduler_core', '0008_payload_search'),
    ]

    operations = [
        migrations.AlterField(
            model_name='attempt',
            name='job',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempt_set', to='scheduler_core.job'),
        ),
        migrations.AlterField(
            model_name='job',
            name='schedule',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='jobs', to='scheduler_core.schedule'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('unique_key__isnull', False)), fields=('unique_key',), name='tenure_job_unique_key'),
        ),
        migrations.AlterField(
            model_name='job',
            name='unique_key',
            field=models.CharField(blank=True, help_text='At most one job holds a key (Meta.constraints: a unique index of the keys set, so jobs without one cost the index nothing).', max_length=300, null=True),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('schedule__isnull', False)), fields=['schedule'], name='tenure_job_schedule'),
        ),
    ]
