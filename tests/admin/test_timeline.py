"""The timeline on an instance's admin page: one SVG bar per step, escaped, bounded.

Runs are real (worker threads on the test database); the page is read through Django's
test client, and the SVG parsed as XML, as a browser would have to.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import selvedge_django as sv
from selvedge_django.admin.timeline import TIMELINE_BARS
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.worker import Worker
from tests.conftest import wait_until
from tests.testapp.workflows.status import HOSTILE

from .test_admin import VIEW, html, staff, url

__all__ = ["staff"]

SVG = "{http://www.w3.org/2000/svg}"


def timeline(page: str) -> ET.Element:
    """The timeline's <svg>, parsed (with the SVG namespace, as the HTML parser gives it)."""
    match = re.search(r"<svg class=\"selvedge-timeline\".*?</svg>", page, re.S)
    assert match, "no timeline on the page"
    text = match.group(0).replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
    return ET.fromstring(text)


def steps(svg: ET.Element) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if "sv-step" in g.get("class", "")]


def classes(step: ET.Element) -> set[str]:
    return set(step.get("class", "").split())


def label(step: ET.Element) -> str:
    return "".join(t.text or "" for t in step.iter(f"{SVG}text"))


def segment_kinds(step: ET.Element) -> list[str]:
    return [r.get("class", "").split()[-1].removeprefix("sv-") for r in step.iter(f"{SVG}rect")]


def test_each_step_is_a_bar_of_its_kind_on_one_time_axis(
    make_worker: Callable[..., Worker], staff: Callable[..., Client]
) -> None:
    make_worker()
    iid = sv.start_workflow("status.tour", None, instance_id="tour-1")
    # Parked at the receive (a wait records its row when a signal is consumed).
    wait_until(lambda: "receive" in WorkflowInstance.objects.get(instance_id=iid).parked_key)
    sv.signal(iid, "go", {"ok": True})
    assert sv.wait_workflow(iid, timeout=30).output == "toured"

    page = html(staff(VIEW).get(url("change", iid)))
    svg = timeline(page)
    bars = steps(svg)
    history = list(
        HistoryEvent.objects.filter(instance_id=iid).order_by("id").values_list("key", "command")
    )
    assert len(bars) == len(history)
    by_key = {key: bar for (key, _), bar in zip(history, bars, strict=True)}
    kinds = {command: classes(by_key[key]) for key, command in history}
    assert "sv-activity" in kinds["activity"]
    assert "sv-timer" in kinds["sleep"]
    assert "sv-signal" in kinds["receive"]
    assert "sv-child" in kinds["child"]
    assert "sv-instant" in kinds["now"] and "sv-instant" in kinds["close"]
    assert all("sv-ok" in c for c in kinds.values())

    # The retried activity: its label counts the attempts, its bar has the earlier part
    # (first attempt and backoff) and the last attempt; the tooltip says so.
    flaky_key = next(k for k, c in history if c == "activity" and "status.flaky" in k)
    flaky = by_key[flaky_key]
    assert label(flaky).endswith("\u00d72")
    assert segment_kinds(flaky) == ["earlier", "attempt"]
    title = flaky.find(f"{SVG}title")
    assert title is not None and title.text is not None
    assert "2 attempt(s), 1 failure(s) of 3 allowed" in title.text
    assert "NotYet: attempt 1 of first failed" in title.text

    # The child's bar links to the child's page.
    child = WorkflowInstance.objects.get(parent_instance_id=iid)
    links = [
        a.get("href") for a in by_key[next(k for k, c in history if c == "child")].iter(f"{SVG}a")
    ]
    assert links == [url("change", child.instance_id)]

    # One axis: bars start in the recorded order, left to right.
    starts = [float(next(bar.iter(f"{SVG}rect")).get("x", 0)) for bar in bars if segment_kinds(bar)]
    assert starts == sorted(starts)
    assert "selvedge-timeline-cut" not in page


def test_hostile_names_are_text_and_a_backoff_still_to_come_is_drawn(
    make_worker: Callable[..., Worker], staff: Callable[..., Client]
) -> None:
    make_worker()
    name = 'status.<b>stalled</b> & "held"'
    iid = sv.start_workflow(name, None, instance_id='<img src=x onerror="alert(1)">')
    wait_until(
        lambda: ActivityTask.objects.filter(
            instance_id=iid, name="status.backing_off", failures=1
        ).exists()
    )
    page = html(staff(VIEW).get(url("change", iid)))
    # Nothing of the names became markup, in the SVG or around it.
    assert "<script>alert" not in page and "<b>stalled</b>" not in page
    assert "<img src=x" not in page and "<i>later</i>" not in page
    svg = timeline(page)  # parses: the escaping kept it well-formed
    bars = steps(svg)
    labels = [label(bar) for bar in bars]
    assert any(HOSTILE in text or HOSTILE[:20] in text for text in labels)
    backing = next(bar for bar in bars if "status.backing_off" in label(bar))
    assert "sv-pending" in classes(backing)
    # Queued for its next attempt ten minutes from now: drawn as a backoff after "now".
    assert "backoff" in segment_kinds(backing)
    assert svg.find(f"{SVG}line[@class='sv-now']") is not None
    title = backing.find(f"{SVG}title")
    assert title is not None and "<i>later</i> is not ready" in (title.text or "")
    sv.terminate_workflow(iid, "done looking")


def test_a_huge_history_draws_the_first_steps_and_says_how_many_were_cut(
    make_worker: Callable[..., Worker], staff: Callable[..., Client]
) -> None:
    ticks = TIMELINE_BARS * 2
    iid = sv.start_workflow("status.ticks", ticks, instance_id="many-ticks")
    for _ in range(ticks):
        sv.signal(iid, "tick", None)
    make_worker()
    assert sv.wait_workflow(iid, timeout=60).output == ticks
    total = HistoryEvent.objects.filter(instance_id=iid).count()
    assert total > TIMELINE_BARS
    client = staff(VIEW)
    with CaptureQueriesContext(connection) as queries:
        page = html(client.get(url("change", iid)))
    assert len(steps(timeline(page))) == TIMELINE_BARS
    assert (
        f"Showing the first {TIMELINE_BARS} of {total} steps: {total - TIMELINE_BARS} steps"
        " are not drawn." in page
    )
    # The timeline's reads are bounded: no query reads the whole history.
    history_reads = [q["sql"] for q in queries.captured_queries if "historyevent" in q["sql"]]
    assert all("LIMIT" in sql or "COUNT(" in sql for sql in history_reads), history_reads


def test_an_instance_without_history_has_no_timeline(tdb: None, admin_client: Any) -> None:
    iid = sv.start_workflow("status.nap", 1, instance_id="not-yet-run")
    page = html(admin_client.get(url("change", iid)))
    assert 'id="selvedge-timeline"' not in page
