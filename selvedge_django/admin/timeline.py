"""An instance's timeline: one bar per step on a time axis, drawn as SVG on the server.

Each history row (in recorded order) is a bar from its reservation to the
arrival of its outcome, or to now while it waits: activities (the last
attempt drawn solid, the queueing, earlier attempts and backoffs before it
light, a backoff still to come dashed), timers (to their fire time, dashed
while armed), waits for signals or conditions, and children (linked to their
page). Steps recorded at once (``now``, patch markers, the close) are a
diamond. The geometry is computed here; the template draws it with Django's
autoescaping, so hostile names never become markup. At most
:data:`TIMELINE_BARS` steps are drawn and the page says how many were cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext

from ..models import ActivityTaskStatus, WorkflowInstance
from ..storage.admin_reads import AdminReads
from .display import error_summary, format_duration, format_time, ms_datetime, truncate

__all__ = ["TIMELINE_BARS", "Timeline", "build_timeline"]

# Steps drawn at most; the rest are counted and named as cut.
TIMELINE_BARS = 150
# The drawing: label column, bar area, row height (SVG user units, 1 = 1 CSS px).
LABEL_WIDTH = 280
PLOT_WIDTH = 660
ROW_HEIGHT = 20
TOP = 24
LABEL_CHARS = 42
TITLE_CHARS = 400
TICKS = 6

# What a step's command draws as.
KINDS = {
    "activity": "activity",
    "sleep": "timer",
    "receive": "signal",
    "await": "signal",
    "child": "child",
}
INSTANT = "instant"


@dataclass
class Segment:
    """A stretch of one bar: ``kind`` is its CSS class (attempt, earlier, backoff, ...)."""

    x: float
    width: float
    kind: str

    @property
    def sx(self) -> str:
        return f"{self.x:.1f}"

    @property
    def sw(self) -> str:
        return f"{self.width:.1f}"


@dataclass
class Bar:
    """One step: where its row and label are, its segments, its outcome and its tooltip."""

    y: float
    label: str
    kind: str
    outcome: str
    title: str
    segments: list[Segment] = field(default_factory=list)
    marker_x: float | None = None
    url: str = ""

    @property
    def text_y(self) -> str:
        return f"{self.y + ROW_HEIGHT * 0.7:.1f}"

    @property
    def bar_y(self) -> str:
        return f"{self.y + 4:.1f}"

    @property
    def marker_points(self) -> str:
        """The diamond of an instant step, as SVG polygon points."""
        if self.marker_x is None:
            return ""
        x, y, r = self.marker_x, self.y + ROW_HEIGHT / 2, 5
        return f"{x:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r:.1f} {x - r:.1f},{y:.1f}"


@dataclass
class Tick:
    x: float
    label: str

    @property
    def sx(self) -> str:
        return f"{self.x:.1f}"


@dataclass
class Timeline:
    """Everything the template needs to draw the SVG."""

    bars: list[Bar]
    ticks: list[Tick]
    width: int
    height: int
    plot_left: int
    plot_right: int
    now_x: float | None
    total_steps: int
    cut: int
    span: str

    @property
    def bar_height(self) -> int:
        return ROW_HEIGHT - 8

    @property
    def now_sx(self) -> str:
        return "" if self.now_x is None else f"{self.now_x:.1f}"

    @property
    def axis_y(self) -> int:
        return TOP - 4


def _outcome(event_type: str, has_value: bool) -> str:
    if not has_value:
        return "pending"
    if "Failed" in event_type or "Timeout" in event_type:
        return "failed"
    if "Cancelled" in event_type:
        return "cancelled"
    return "ok"


def build_timeline(
    reads: AdminReads,
    instance: WorkflowInstance,
    history_count: int,
    child_urls: dict[str, str],
    values: bool = True,
) -> Timeline | None:
    """Read the first :data:`TIMELINE_BARS` steps and lay them out; None without steps.

    ``child_urls`` maps a child step's key to the child's admin page; without
    ``values`` (no ``view_payloads``) an error shows its type only. Reads are
    bounded: that many history rows (timestamps only, no values), and the activity
    tasks of the activity steps among them.
    """
    recorded = reads.timeline_rows(instance.instance_id, limit=TIMELINE_BARS)
    keys_with_values = {row[0] for row in recorded if row[5]}
    rows = [row[:5] for row in recorded]
    if not rows:
        return None
    activity_keys = [key for key, command, *_ in rows if command == "activity"]
    tasks = reads.timeline_tasks(instance.instance_id, activity_keys)
    now = timezone.now()
    running = instance.status == "running"
    # The extent of the axis: every start and end drawn.
    spans: list[tuple[datetime, datetime]] = []
    previous_end: datetime | None = None
    for key, command, _event, created, arrived in rows:
        end = arrived or (now if running else created)
        task = tasks.get(key)
        if task is not None and task["status"] == ActivityTaskStatus.QUEUED:
            backoff = ms_datetime(task["not_before_ms"] or None)
            if backoff is not None and backoff > end:
                end = backoff
        begin = created
        # A wait's row is written when what it waited for is consumed: the wait began
        # when the workflow got there, as the step before it ended.
        if KINDS.get(command) == "signal" and previous_end is not None and previous_end < created:
            begin = previous_end
        spans.append((begin, max(end, created)))
        previous_end = max(end, created)
    start = min([instance.started_at, *(s for s, _ in spans)])
    finish = max([e for _, e in spans] + [instance.closed_at or (now if running else start)])
    total = max((finish - start).total_seconds(), 0.001)

    def x(moment: datetime) -> float:
        offset = (moment - start).total_seconds()
        return LABEL_WIDTH + PLOT_WIDTH * min(max(offset / total, 0.0), 1.0)

    bars: list[Bar] = []
    for index, ((key, command, event, created, arrived), (begin, end)) in enumerate(
        zip(rows, spans, strict=True)
    ):
        kind = KINDS.get(command, INSTANT)
        has_value = key in keys_with_values
        outcome = _outcome(event, has_value)
        label = key
        details = [f"{key} ({command}: {event})"]
        bar = Bar(y=TOP + index * ROW_HEIGHT, label="", kind=kind, outcome=outcome, title="")
        if kind == INSTANT:
            bar.marker_x = x(created)
            details.append(gettext("at %(t)s") % {"t": format_time(created)})
        else:
            took = format_duration((end - begin).total_seconds())
            waiting = gettext("waiting for %(t)s") if arrived is None else gettext("took %(t)s")
            details.append(waiting % {"t": took})
            left, right = x(begin), max(x(end), x(begin) + 1.5)
            task = tasks.get(key)
            if kind == "activity" and task is not None:
                details.append(gettext("activity %(name)s") % {"name": task["name"]})
                details.append(
                    gettext("%(a)d attempt(s), %(f)d failure(s) of %(m)d allowed")
                    % {"a": task["attempts"], "f": task["failures"], "m": task["max_attempts"]}
                )
                if task["last_error"]:
                    details.append(
                        gettext("last error: %(e)s")
                        % {"e": error_summary(task["last_error"], values=values)}
                    )
                bar.segments += _activity_segments(task, begin, arrived, now, x, left, right)
                if task["attempts"] > 1:
                    label += gettext(" \u00d7%(n)d") % {"n": task["attempts"]}
            else:
                dashed = arrived is None and kind == "timer"
                bar.segments.append(Segment(left, right - left, "pending" if dashed else "span"))
            if kind == "child" and key in child_urls:
                bar.url = child_urls[key]
        bar.label = truncate(label, LABEL_CHARS)
        bar.title = truncate("\n".join(details), TITLE_CHARS)
        bars.append(bar)

    ticks = [
        Tick(
            LABEL_WIDTH + PLOT_WIDTH * i / (TICKS - 1),
            "+" + (format_duration(total * i / (TICKS - 1)) or "0"),
        )
        for i in range(TICKS)
    ]
    now_x = x(now) if running else None
    height = TOP + len(bars) * ROW_HEIGHT + 8
    return Timeline(
        bars=bars,
        ticks=ticks,
        width=LABEL_WIDTH + PLOT_WIDTH + 40,
        height=height,
        plot_left=LABEL_WIDTH,
        plot_right=LABEL_WIDTH + PLOT_WIDTH,
        now_x=now_x,
        total_steps=history_count,
        cut=max(0, history_count - len(bars)),
        span=format_duration(total) or "",
    )


def _activity_segments(
    task: Mapping[str, Any],
    begin: datetime,
    arrived: datetime | None,
    now: datetime,
    x: Callable[[datetime], float],
    left: float,
    right: float,
) -> list[Segment]:
    """An activity's bar: before its last attempt (queued, earlier attempts, backoffs), the
    last attempt, and a backoff still to come."""
    segments: list[Segment] = []
    end = arrived or now
    last_start = ms_datetime(task["claim_started_ms"])
    if last_start is not None and begin <= last_start <= end + timedelta(seconds=1):
        split = x(last_start)
        earlier = "earlier" if task["attempts"] > 1 else "queued"
        if split > left:
            segments.append(Segment(left, split - left, earlier))
        segments.append(Segment(split, max(x(end) - split, 1.5), "attempt"))
    else:
        segments.append(
            Segment(left, max(x(end) - left, 1.5), "queued" if arrived is None else "attempt")
        )
    backoff = ms_datetime(task["not_before_ms"] or None)
    if (
        arrived is None
        and task["status"] == ActivityTaskStatus.QUEUED
        and backoff
        and backoff > now
    ):
        segments.append(Segment(x(now), max(right - x(now), 1.5), "backoff"))
    return segments
