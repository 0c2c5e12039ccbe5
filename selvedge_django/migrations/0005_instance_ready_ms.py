"""Dispatch leases the instance runnable longest first: ``ready_ms`` and its index.

Instances runnable before this migration get ``ready_ms = 0``: they are leased
before anything that becomes runnable afterwards.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('selvedge_django', '0004_timer_fire_at_ms'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='workflowinstance',
            name='sv_inst_dispatch_idx',
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='ready_ms',
            field=models.BigIntegerField(db_default=0, default=0, help_text='when the instance last became runnable (database clock, Unix ms): dispatch leases the oldest first, and never before this time'),
        ),
        migrations.AddIndex(
            model_name='workflowinstance',
            index=models.Index(condition=models.Q(('lease_owner', ''), ('runnable', True), ('status', 'running')), fields=['ready_ms', 'workflow_name'], name='sv_inst_ready_idx'),
        ),
    ]
