"""Timers fire by the database clock: ``fire_at_ms`` (Unix ms on that clock).

Timers armed before this migration fire when the database clock reaches their
recorded expiry (``expires_at``), which is how they were fired before.
"""

from django.db import migrations, models


def fill_fire_at(apps, schema_editor):  # type: ignore[no-untyped-def]
    timer = apps.get_model("selvedge_django", "TimerSubscription")
    alias = schema_editor.connection.alias
    pending = timer.objects.using(alias).filter(fire_at_ms=0).order_by("id")
    for timer_id, expires_at in pending.values_list("id", "expires_at").iterator():
        timer.objects.using(alias).filter(id=timer_id).update(
            fire_at_ms=round(expires_at.timestamp() * 1000)
        )


class Migration(migrations.Migration):
    dependencies = [
        ("selvedge_django", "0003_view_payloads_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="timersubscription",
            name="fire_at_ms",
            field=models.BigIntegerField(
                default=0,
                help_text="when it fires, on the database clock (Unix ms): the arming time"
                " plus the timer's duration",
            ),
            preserve_default=False,
        ),
        migrations.RunPython(fill_fire_at, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="timersubscription",
            name="expires_at",
            field=models.DateTimeField(
                help_text="workflow time (CLOCK): the value recorded at fire"
            ),
        ),
        migrations.RemoveIndex(
            model_name="timersubscription",
            name="sv_timer_due_idx",
        ),
        migrations.AddIndex(
            model_name="timersubscription",
            index=models.Index(
                condition=models.Q(("fired", False)),
                fields=["fire_at_ms", "id"],
                name="sv_timer_fire_idx",
            ),
        ),
    ]
