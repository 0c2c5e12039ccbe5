"""The instance table keeps a fifth of each page free on PostgreSQL (``fillfactor = 80``).

Most updates of a running instance change an indexed column (its lease, status or
readiness), but the rest (the current step, the parked position, progress, the
updated time) can be HOT updates, which write no index entry, if the new row version
fits on the old one's page. With full pages they do not: with 1,000,000 instances in
the table, 13 % of the instance updates of a live workload were HOT at the default
fillfactor (100) and 42 % at 80 (``bench/scale_out.py --only tables``, bench/README.md),
each one sparing the table's sixteen indexes an entry. The task and history tables stay
at 100: every update there changes an indexed column, so none can be HOT.

``ALTER TABLE ... SET (fillfactor = ...)`` rewrites nothing and holds its lock for a
moment: pages written from then on keep the room; existing full pages get it as they
are rewritten. SQLite has no fillfactor: nothing runs there.
"""

from django.db import migrations

TABLE = '"selvedge_django_workflowinstance"'

SET = {"postgresql": [f"ALTER TABLE {TABLE} SET (fillfactor = 80)"]}
RESET = {"postgresql": [f"ALTER TABLE {TABLE} RESET (fillfactor)"]}


def run(statements):  # type: ignore[no-untyped-def]
    def operation(apps, schema_editor):  # type: ignore[no-untyped-def]
        for statement in statements.get(schema_editor.connection.vendor, ()):
            schema_editor.execute(statement)

    return operation


class Migration(migrations.Migration):

    dependencies = [
        ("selvedge_django", "0023_pause"),
    ]

    operations = [
        migrations.RunPython(run(SET), run(RESET)),
    ]
