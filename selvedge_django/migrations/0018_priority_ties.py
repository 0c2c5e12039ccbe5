"""Dispatch breaks ties of equal rank by the order of creation (``created_seq``).

Two instances that became ready within the same millisecond with the same priority
were equals, taken in no set order. Each start now takes a creation number (on
PostgreSQL from the sequence made here, on SQLite the rowid the row gets), and
``sv_inst_rank_idx`` orders by it after the rank. Existing rows are numbered in the
order they were started.
"""

import selvedge_django.flow_models
from django.db import migrations, models

SEQUENCE = "selvedge_django_instance_seq"
TABLE = '"selvedge_django_workflowinstance"'

# The statements of each database, by vendor: the sequence, and the numbering of the
# rows that exist (in the order they were started; SQLite's rowid is that order).
CREATE = {"postgresql": [f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE} AS bigint"]}
DROP = {"postgresql": [f"DROP SEQUENCE IF EXISTS {SEQUENCE}"]}
NUMBER = {
    "postgresql": [
        f"UPDATE {TABLE} SET created_seq = o.n FROM (SELECT instance_id, row_number()"
        f" OVER (ORDER BY started_at, instance_id) AS n FROM {TABLE}) o"
        f" WHERE {TABLE}.instance_id = o.instance_id",
        f"SELECT setval('{SEQUENCE}', (SELECT COALESCE(MAX(created_seq), 0) + 1"
        f" FROM {TABLE}), false)",
    ],
    "sqlite": [f"UPDATE {TABLE} SET created_seq = rowid"],
}


def run(statements):  # type: ignore[no-untyped-def]
    def operation(apps, schema_editor):  # type: ignore[no-untyped-def]
        for statement in statements.get(schema_editor.connection.vendor, ()):
            schema_editor.execute(statement)

    return operation


class Migration(migrations.Migration):

    dependencies = [
        ('selvedge_django', '0017_flow_control'),
    ]

    operations = [
        migrations.RunPython(run(CREATE), run(DROP)),
        migrations.RemoveIndex(
            model_name='workflowinstance',
            name='sv_inst_rank_idx',
        ),
        migrations.AddField(
            model_name='workflowinstance',
            name='created_seq',
            field=models.BigIntegerField(db_default=0, default=0, help_text='the order of creation (a sequence, larger is newer): dispatch takes the oldest first among equal ranks'),
        ),
        migrations.RunPython(run(NUMBER), migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='workflowinstance',
            index=models.Index(selvedge_django.flow_models.PriorityRank('ready_ms', 'priority'), models.F('created_seq'), models.F('ready_ms'), models.F('workflow_name'), models.F('code_version'), condition=models.Q(('lease_owner', ''), ('runnable', True), ('status', 'running')), name='sv_inst_rank_idx'),
        ),
    ]
