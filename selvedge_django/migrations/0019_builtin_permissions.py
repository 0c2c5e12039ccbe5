"""The permission ``start_builtin_workflows``: starting a built-in workflow by name from
the admin needs it (``selvedge.prune`` also the delete permission). Permissions only:
no table changes.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('selvedge_django', '0018_priority_ties'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='workflowinstance',
            options={'ordering': ('-started_at', '-instance_id'), 'permissions': [('cancel_workflowinstance', 'Can cancel workflow instances'), ('signal_workflowinstance', 'Can signal workflow instances'), ('export_history', 'Can export workflow history'), ('view_payloads', 'Can view workflow inputs, outputs and signal payloads'), ('terminate_workflowinstance', 'Can terminate workflow instances'), ('resume_workflowinstance', 'Can resume workflow instances'), ('fork_workflowinstance', 'Can fork workflow instances'), ('start_workflowinstance', 'Can start workflow instances'), ('start_builtin_workflows', 'Can start built-in workflows (selvedge.prune also needs delete)')], 'verbose_name': 'workflow instance'},
        ),
    ]
