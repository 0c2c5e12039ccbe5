"""Pausing: the paused activity queues (``ActivityQueue``), an instance's pause reason
and time, the ``held`` mark of a paused instance's tasks and timers (a held task leaves
``sv_task_rank_idx``, a held timer ``sv_timer_fire_idx``), and the permission
``pause_workflowinstance``.
"""

import selvedge_django.models.system
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('selvedge_django', '0022_streams'),
    ]

    operations = [
        migrations.CreateModel(
            name='ActivityQueue',
            fields=[
                ('name', models.CharField(blank=True, max_length=255, primary_key=True, serialize=False)),
                ('paused', models.BooleanField(default=False)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'activity queue',
                'ordering': ('name',),
            },
        ),
        migrations.AlterModelOptions(
            name='workflowinstance',
            options={'ordering': ('-started_at', '-instance_id'), 'permissions': [('cancel_workflowinstance', 'Can cancel workflow instances'), ('signal_workflowinstance', 'Can signal workflow instances'), ('export_history', 'Can export workflow history'), ('view_payloads', 'Can view workflow inputs, outputs and signal payloads'), ('terminate_workflowinstance', 'Can terminate workflow instances'), ('resume_workflowinstance', 'Can resume workflow instances'), ('fork_workflowinstance', 'Can fork workflow instances'), ('pause_workflowinstance', 'Can pause and unpause workflow instances and queues'), ('start_workflowinstance', 'Can start workflow instances'), ('start_builtin_workflows', 'Can start built-in workflows (selvedge.prune also needs delete)')], 'verbose_name': 'workflow instance'},
        ),
        migrations.RemoveIndex(
            model_name='activitytask',
            name='sv_task_rank_idx',
        ),
        migrations.RemoveIndex(
            model_name='timersubscription',
            name='sv_timer_fire_idx',
        ),
        migrations.AddField(
            model_name='activitytask',
            name='held',
            field=models.BooleanField(db_default=False, default=False, help_text='its instance is paused: no claim takes it until the unpause'),
        ),
        migrations.AddField(
            model_name='timersubscription',
            name='held',
            field=models.BooleanField(db_default=False, default=False, help_text='its instance is paused: fires after unpause'),
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='paused_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='paused_reason',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddIndex(
            model_name='activitytask',
            index=models.Index(selvedge_django.models.system.PriorityRank('not_before_ms', 'priority'), models.F('id'), models.F('not_before_ms'), condition=models.Q(('held', False), ('status', 'queued')), name='sv_task_rank_idx'),
        ),
        migrations.AddIndex(
            model_name='timersubscription',
            index=models.Index(condition=models.Q(('fired', False), ('held', False)), fields=['fire_at_ms', 'id'], name='sv_timer_fire_idx'),
        ),
    ]
