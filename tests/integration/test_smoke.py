from __future__ import annotations

import selvedge_django as sv
from selvedge_django.models import HistoryEvent


def test_three_activity_workflow_completes(worker) -> None:
    instance_id = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    result = sv.wait_workflow(instance_id, timeout=20)
    assert result.status == "completed"
    assert result.output == 6
    values = HistoryEvent.objects.filter(instance_id=instance_id, command="activity")
    assert [v.data for v in values.order_by("seq")] == ["3", "6", "6"]
