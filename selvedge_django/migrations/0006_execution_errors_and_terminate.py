"""Poison instances: the count and last of an instance's storage errors in a row, and the
``terminate_workflowinstance`` permission of the admin's terminate action."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('selvedge_django', '0005_instance_ready_ms'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='workflowinstance',
            options={'ordering': ('-started_at', '-instance_id'), 'permissions': [('cancel_workflowinstance', 'Can cancel workflow instances'), ('signal_workflowinstance', 'Can signal workflow instances'), ('export_history', 'Can export workflow history'), ('view_payloads', 'Can view workflow inputs, outputs and signal payloads'), ('terminate_workflowinstance', 'Can terminate workflow instances')], 'verbose_name': 'workflow instance'},
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='execution_error',
            field=models.TextField(blank=True, db_default='', default='', help_text='the last of those errors'),
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='execution_errors',
            field=models.IntegerField(db_default=0, default=0, help_text='executions in a row that ended on a storage error (0 after one that did not)'),
        ),
    ]
