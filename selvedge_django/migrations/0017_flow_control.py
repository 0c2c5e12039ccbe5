"""Flow control: priorities, concurrency keys and the claims of rate-limited queues.

Dispatch and claims order by ``ready - 60000 * priority`` (``PriorityRank``): new
partial indexes on that expression, beside the ready-time indexes. Existing rows get priority
0; queued tasks keep ``not_before_ms = 0`` (due since ever: claimed first).
"""

import selvedge_django.flow_models
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('selvedge_django', '0016_sticky_dispatch'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueueClaim',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('queue', models.CharField(max_length=255)),
                ('claimed_ms', models.BigIntegerField(help_text='database clock, Unix ms')),
            ],
            options={
                'verbose_name': 'queue claim',
            },
        ),
        migrations.AddField(
            model_name='activitytask',
            name='concurrency_key',
            field=models.CharField(blank=True, db_default='', default='', max_length=255),
        ),
        migrations.AddField(
            model_name='activitytask',
            name='max_concurrency',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='activitytask',
            name='priority',
            field=models.SmallIntegerField(db_default=0, default=0, help_text='claim order, -100 to 100, larger first'),
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='priority',
            field=models.SmallIntegerField(db_default=0, default=0, help_text='dispatch order, -100 to 100, larger first'),
        ),
        migrations.AddIndex(
            model_name='activitytask',
            index=models.Index(selvedge_django.flow_models.PriorityRank('not_before_ms', 'priority'), models.F('id'), models.F('not_before_ms'), condition=models.Q(('status', 'queued')), name='sv_task_rank_idx'),
        ),
        migrations.AddIndex(
            model_name='activitytask',
            index=models.Index(condition=models.Q(('status', 'running'), models.Q(('concurrency_key', ''), _negated=True)), fields=['concurrency_key'], name='sv_task_running_key_idx'),
        ),
        migrations.AddIndex(
            model_name='workflowinstance',
            index=models.Index(selvedge_django.flow_models.PriorityRank('ready_ms', 'priority'), models.F('ready_ms'), models.F('workflow_name'), models.F('code_version'), condition=models.Q(('lease_owner', ''), ('runnable', True), ('status', 'running')), name='sv_inst_rank_idx'),
        ),
        migrations.AddIndex(
            model_name='queueclaim',
            index=models.Index(fields=['queue', 'claimed_ms'], name='sv_queue_claim_idx'),
        ),
    ]
