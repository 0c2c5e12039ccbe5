"""Drop the instance-id indexes that another index repeats or that nothing reads.

A foreign key gets an index of its own, and on PostgreSQL a second one for ``LIKE``
(``varchar_pattern_ops``, the key being text). On the history, task, timer, archive
and stream tables a unique index already leads with the instance (``(instance, key)``
and its like), which serves every lookup by instance and the foreign key's checks as
well: the two extra indexes were only written, on every row inserted. Dropping them
takes two of the four index entries of each history row and two of the seven of each
queued task (``bench/bench_bulk.py``; bench/README.md). The signal table keeps its
plain index: none of its others covers every row.

The ``varchar_pattern_ops`` index of the instance id (the instance table's primary
key, the signal table's foreign key) goes on PostgreSQL as well: it serves only a
case-sensitive prefix match (``LIKE 'abc%'``), which nothing runs (the admin and the
operator reads search with ``icontains``), and it took an entry at every start and at
every instance update that is not HOT.

Only the indexes go: on SQLite a changed field would copy the whole table, so the
schema change is the indexes' ``DROP INDEX`` alone (found by introspection: the
indexes on ``instance_id`` alone that are neither unique nor named by the model),
and the model state records ``db_index=False``. Reversing creates them again.
"""

from django.db import migrations, models

# The models whose tables lose the index: each has a unique index leading with the instance.
MODELS = (
    "activitytask",
    "archivedhistoryevent",
    "historyevent",
    "timersubscription",
    "workflowstream",
    "workflowstreamentry",
)
# The models whose tables lose only the instance id's pattern index (PostgreSQL).
PATTERN_INDEXED = ("workflowinstance", "signalmessage")

# By vendor: the names of a table's pattern indexes of the instance id (%s: the table).
PATTERN_INDEXES = {
    "postgresql": (
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        " AND tablename = %s AND indexdef LIKE '%%(instance_id varchar_pattern_ops)'"
    ),
}
DROP_INDEX = "DROP INDEX {index}"
# The reverse: a table's index of the instance id ({index}, {table}) and, by vendor,
# its pattern index ({like}).
CREATE_INDEX = "CREATE INDEX {index} ON {table} (instance_id)"
CREATE_PATTERN_INDEX = {
    "postgresql": "CREATE INDEX {like} ON {table} (instance_id varchar_pattern_ops)",
}


def drop_indexes(apps, schema_editor):  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    quote = schema_editor.quote_name
    for name in MODELS:
        model = apps.get_model("selvedge_django", name)
        named = {index.name for index in model._meta.indexes}
        with connection.cursor() as cursor:
            constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
        for index, info in sorted(constraints.items()):
            if (
                info["index"]
                and not info["unique"]
                and not info["primary_key"]
                and info["columns"] == ["instance_id"]
                and index not in named
            ):
                schema_editor.execute(DROP_INDEX.format(index=quote(index)))
    query = PATTERN_INDEXES.get(connection.vendor)
    for name in PATTERN_INDEXED if query else ():
        with connection.cursor() as cursor:
            cursor.execute(query, [apps.get_model("selvedge_django", name)._meta.db_table])
            indexes = [row[0] for row in cursor.fetchall()]
        for index in indexes:
            schema_editor.execute(DROP_INDEX.format(index=quote(index)))


def create_indexes(apps, schema_editor):  # type: ignore[no-untyped-def]
    quote = schema_editor.quote_name
    pattern = CREATE_PATTERN_INDEX.get(schema_editor.connection.vendor)
    for name in (*PATTERN_INDEXED, *MODELS):
        table = apps.get_model("selvedge_django", name)._meta.db_table
        names = {"table": quote(table), "like": quote(f"{table}_instance_id_like")}
        if name in MODELS:
            schema_editor.execute(CREATE_INDEX.format(index=quote(f"{table}_instance_id"), **names))
        if pattern:
            schema_editor.execute(pattern.format(**names))


def unindexed(model_name: str, related_name: str) -> migrations.AlterField:
    return migrations.AlterField(
        model_name=model_name,
        name="instance",
        field=models.ForeignKey(
            db_index=False,
            on_delete=models.deletion.CASCADE,
            related_name=related_name,
            to="selvedge_django.workflowinstance",
        ),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("selvedge_django", "0024_instance_fillfactor"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
            state_operations=[
                unindexed("activitytask", "activity_tasks"),
                unindexed("archivedhistoryevent", "archived_history"),
                unindexed("historyevent", "history"),
                unindexed("timersubscription", "timers"),
                unindexed("workflowstream", "streams"),
                unindexed("workflowstreamentry", "stream_entries"),
            ],
        ),
    ]
