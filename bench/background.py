"""The background path of ``bench_core.py --background``: activity steps run by activity workers.

A background step is an activity the workflow's worker does not run on the workflow's
own thread: ``act.execute(ctx, x)`` reserves a queued task (and, since the workflow can
only wait, releases the lease in the same write), an activity worker claims the task,
runs it and records its outcome, which wakes the instance, and a dispatcher leases it
again and the workflow goes on (with the workflow cache, the parked execution goes on
without a replay). Here the activities live on a queue the workflow's worker does not
serve (``ACTIVITY_QUEUES = []``), and a second worker in the same process serves that
queue and leases no instance (``COMPATIBLE_VERSIONS = []``, ``RUN_LOCAL_STARTS`` off):
the shape of a deployment with separate activity workers.

Three measurements per database, each counting every statement and transaction by the
store method that ran it (``SqlCounter``), split into calls that found work and calls
that found nothing (``claim_tasks (nothing)``: an idle claim poll):

1. **driven**: both workers' loops run by ``run_once()`` from this thread, with inline
   pools (so no idle poll, and no workflow cache: each resumption replays); what the
   step itself costs.
2. **threads**: both workers started with the defaults, workflows started and awaited
   one at a time; what a step costs with the loops' own polls, renewals and NOTIFY
   wake-ups, as in a deployment.
3. **throughput**: N workflows (at most ``THROUGHPUT_MAX``) started up front, then
   both workers; workflows/s, and the same counts where several claims and
   completions wait at once.

Per step, 1 and 2 subtract a workflow of no steps from one of ``--steps`` steps (so
the start, the first dispatch and the close drop out) and divide by the steps; 3
divides everything (start and close included) by the steps.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import platform
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.harness import UNTRACKED, SqlCounter, store_classes, transactions

BACKGROUND_QUEUE = "bench-background"
# At most this many workflows in the throughput part: each execution waiting for its
# step is kept by the workflow cache with its thread, and that thread's connection stays
# open for a second (worker/cache.py), so 100 waiting at once need more connections than
# PostgreSQL's default max_connections (100) allows.
THROUGHPUT_MAX = 40

# Methods whose empty result is a poll that found nothing.
POLLS = {"claim_tasks", "claim_task", "lease_batch"}
# What a workflow's own life runs (the rest is the loops' idle polls, the client's
# reads and housekeeping: renewals, heartbeats, the leader's duties).
WORKFLOW_METHODS = {
    "create_instance",
    "reserve_activity",
    "claim_tasks",
    "claim_task",
    "complete_task",
    "complete_task (group commit)",
    "complete_closing",
    "lease_batch",
    "load_snapshot",
    "get_row",
    "has_deferred",
    "paused_queue_names",
    "close",
    "release_lease",
}
CLIENT_METHODS = {"get_result_row", "get_instance", "get_result"}
# Store plumbing that only ever runs inside another tracked method.
PLUMBING = {"atomic", "read_snapshot", "after_commit", "now_expr"}


class PollCounter(SqlCounter):
    """A SqlCounter that charges a poll that found nothing to ``<method> (nothing)``."""

    def __init__(self) -> None:
        super().__init__()
        self._tokens = itertools.count()

    def _tracked(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = local.__dict__.setdefault("ops", [])
            outer = not stack
            label = f"{name}\0{next(self._tokens)}" if outer else name
            stack.append(label)
            found: Any = True
            try:
                found = fn(*args, **kwargs)
                return found
            finally:
                stack.pop()
                if outer:
                    final = name if name not in POLLS or found else f"{name} (nothing)"
                    with self._lock:
                        self.calls[final] += 1
                        counts = self.by_op.pop(label, None)
                        if counts:
                            self.by_op[final].update(counts)
                        shapes = self.shapes.pop(label, None)
                        if shapes:
                            self.shapes[final].update(shapes)

        wrapper._bench_tracked = True  # type: ignore[attr-defined]
        return wrapper


_WORKFLOW: list[Any] = []


def define() -> Any:
    """Register the background activity and the workflow of ``data["steps"]`` steps (once)."""
    import selvedge_django as sv

    if _WORKFLOW:
        return _WORKFLOW[0]

    @sv.activity(name="bench.bg.add_one", queue=BACKGROUND_QUEUE)
    def add_one(x: int) -> int:
        return x + 1

    @sv.workflow(name="bench.bg.steps")
    def steps(ctx: sv.WorkflowContext, data: dict[str, int]) -> int:
        x = data["x"]
        for _ in range(data["steps"]):
            x = add_one.execute(ctx, x)
        return x

    _WORKFLOW.append(steps)
    return steps


def _workers(driven: bool) -> tuple[Any, Any]:
    """The workflow worker (serves no activity queue) and the activity worker (serves
    the background queue, leases nothing)."""
    from selvedge_django.worker import Worker

    workflows = Worker(worker_id=f"bench-wf-{os.getpid()}", activity_queues=[])
    activities = Worker(
        worker_id=f"bench-act-{os.getpid()}",
        activity_queues=[BACKGROUND_QUEUE],
        compatible_versions=[],
        run_local_starts=False,
    )
    if driven:
        for worker in (workflows, activities):
            worker.resumptions.inline = True
            worker.activities.inline = True
    return workflows, activities


def _driven_run(workflow: Any, workflows: Any, activities: Any, steps: int, x: int) -> str:
    import selvedge_django as sv

    instance_id = sv.start_workflow(workflow, {"x": x, "steps": steps})
    if workflows.dispatcher.run_once() != 1:
        raise RuntimeError("not dispatched")
    for _ in range(steps):
        if activities.activity_poller.run_once() != 1:
            raise RuntimeError("no task claimed")
        if workflows.dispatcher.run_once() != 1:
            raise RuntimeError("not dispatched after the completion")
    return instance_id


def _check(ids: list[tuple[str, int]], steps: int) -> None:
    import selvedge_django as sv

    for instance_id, x in ids:
        result = sv.get_workflow_result(instance_id)
        if result.status != "completed" or result.output != x + steps:
            raise RuntimeError(f"{instance_id}: {result.status} {result.output!r} {result.error!r}")


def measure_steps(counter: PollCounter, n: int, steps: int, driven: bool) -> dict[str, Any]:
    """Run ``n`` workflows of ``steps`` steps and ``n`` of none, one at a time; count."""
    import selvedge_django as sv

    workflow = define()
    workflows, activities = _workers(driven)
    if not driven:
        activities.start()
        workflows.start()

    def one(count: int, x: int) -> str:
        if driven:
            return _driven_run(workflow, workflows, activities, count, x)
        instance_id = sv.start_workflow(workflow, {"x": x, "steps": count})
        sv.wait_workflow(instance_id, timeout=60)
        return instance_id

    try:
        one(steps, -1)  # warm up: connections, first-use caches
        one(0, -2)
        out: dict[str, Any] = {}
        for count in (0, steps):
            counter.reset()
            ids = [(one(count, x), x) for x in range(n)]
            out[count] = counter.snapshot()
            _check(ids, count)
    finally:
        if not driven:
            workflows.stop(timeout=10)
            activities.stop(timeout=10)
    return {"zero": out[0], "full": out[steps], "n": n, "steps": steps}


def measure_throughput(counter: PollCounter, n: int, steps: int) -> dict[str, Any]:
    """Start ``n`` workflows up front, then run both workers until every one closed."""
    from django.db.models import Max
    from django.utils import timezone

    import selvedge_django as sv
    from selvedge_django.models import WorkflowInstance

    workflow = define()
    workflows, activities = _workers(driven=False)
    counter.reset()
    first_start = timezone.now()
    ids = [(sv.start_workflow(workflow, {"x": x, "steps": steps}), x) for x in range(n)]
    activities.start()
    workflows.start()
    try:
        for instance_id, _ in ids:
            sv.wait_workflow(instance_id, timeout=300)
    finally:
        workflows.stop(timeout=10)
        activities.stop(timeout=10)
    snapshot = counter.snapshot()
    _check(ids, steps)
    last_close = WorkflowInstance.objects.filter(
        instance_id__in=[instance_id for instance_id, _ in ids]
    ).aggregate(last=Max("closed_at"))["last"]
    return {"elapsed": (last_close - first_start).total_seconds(), "counts": snapshot}


# -- printing ---------------------------------------------------------------------------


def _kind(op: str) -> str:
    if op.endswith("(nothing)") or op == "next_task_due_ms":
        return "poll"
    if op in WORKFLOW_METHODS or op == UNTRACKED:
        return "step"  # statements outside every store method are counted too
    if op in CLIENT_METHODS:
        return "client"
    return "housekeeping"


def _per_method(
    full: tuple[Any, ...], zero: tuple[Any, ...] | None, divisor: float
) -> dict[str, tuple[float, Counter[str]]]:
    """(calls, counts) per method: ``full`` minus ``zero``, over ``divisor``."""
    counts, calls, _ = full
    rows: dict[str, tuple[float, Counter[str]]] = {}
    names = set(counts) | set(calls) | (set(zero[0]) | set(zero[1]) if zero else set())
    for op in names:
        c = Counter(counts.get(op, Counter()))
        ncalls = float(calls.get(op, 0))
        if zero is not None:
            c.subtract(zero[0].get(op, Counter()))
            ncalls -= zero[1].get(op, 0)
        values = Counter({k: v / divisor for k, v in c.items()})
        values["transactions"] = transactions(c) / divisor
        rows[op] = (ncalls / divisor, values)
    return rows


def print_methods(title: str, rows: dict[str, tuple[float, Counter[str]]]) -> None:
    print(title)
    print(
        f"  {'store method':<34}{'calls':>8}{'queries':>9}{'commits':>9}"
        f"{'autocommit':>12}{'transactions':>14}"
    )
    totals: dict[str, Counter[str]] = {}
    order = {"step": 0, "poll": 1, "client": 2, "housekeeping": 3}
    for op in sorted(rows, key=lambda op: (order[_kind(op)], op)):
        ncalls, c = rows[op]
        if abs(ncalls) < 0.005 and abs(c["queries"]) < 0.005 and abs(c["transactions"]) < 0.005:
            continue
        kind = _kind(op)
        totals.setdefault(kind, Counter()).update(c)
        label = op if op != UNTRACKED else "(outside the store)"
        print(
            f"  {label:<34}{ncalls:>8.2f}{c['queries']:>9.2f}{c['commits']:>9.2f}"
            f"{c['autocommit']:>12.2f}{c['transactions']:>14.2f}"
        )
    both: Counter[str] = Counter()
    for kind in ("step", "poll"):
        c = totals.get(kind, Counter())
        both.update(c)
        print(
            f"  {'= ' + kind + ' methods':<34}{'':>8}{c['queries']:>9.2f}{c['commits']:>9.2f}"
            f"{c['autocommit']:>12.2f}{c['transactions']:>14.2f}"
        )
    print(
        f"  {'= background step, polls included':<34}{'':>8}{both['queries']:>9.2f}"
        f"{both['commits']:>9.2f}{both['autocommit']:>12.2f}{both['transactions']:>14.2f}"
    )
    for kind, label in (("client", "client reads"), ("housekeeping", "housekeeping")):
        c = totals.get(kind, Counter())
        print(
            f"  {'  (not counted: ' + label + ')':<34}{'':>8}{c['queries']:>9.2f}"
            f"{c['commits']:>9.2f}{c['autocommit']:>12.2f}{c['transactions']:>14.2f}"
        )


def run(db: str, info: dict[str, str], n: int, steps: int, throughput_n: int) -> None:
    """All three measurements on the configured database, printed."""
    import django

    counter = PollCounter()
    for tracked in store_classes():
        names = [
            name
            for cls in tracked.__mro__
            for name, attr in vars(cls).items()
            if inspect.isfunction(attr) and not name.startswith("_") and name not in PLUMBING
        ]
        counter.track(tracked, names)
    # SQLite's group commit: the transaction of several completions waiting at once.
    from selvedge_django.worker.group_commit import GroupCommit

    if not getattr(GroupCommit._write, "_bench_tracked", False):
        GroupCommit._write = counter._tracked(  # type: ignore[method-assign]
            "complete_task (group commit)", GroupCommit._write
        )
    counter.install()
    print(f"== {db}: {info['version']} (background steps) ==")
    print(
        f"Django {django.get_version()}, Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(
        f"Workload: act.execute(ctx, x) of an activity on a queue only a second worker serves; "
        f"{steps} steps per workflow"
    )
    print()
    for driven, title in (
        (True, "driven by run_once(), no idle polls, no workflow cache"),
        (False, "two started workers with the defaults, one workflow at a time"),
    ):
        t0 = time.perf_counter()
        result = measure_steps(counter, n, steps, driven)
        elapsed = time.perf_counter() - t0
        rows = _per_method(result["full"], result["zero"], n * steps)
        print_methods(
            f"Per background step, {title} ({n} workflows of {steps} steps minus {n} of none; "
            f"{elapsed:.1f} s):",
            rows,
        )
        print()
    result = measure_throughput(counter, throughput_n, steps)
    elapsed = result["elapsed"]
    print(
        f"Throughput: {throughput_n} workflows of {steps} background steps started up front, "
        f"then both workers (defaults)"
    )
    print(f"  workflows/s                      {throughput_n / elapsed:>8.1f}")
    print(f"  background steps/s               {throughput_n * steps / elapsed:>8.1f}")
    rows = _per_method(result["counts"], None, throughput_n * steps)
    print_methods("  per step, start and close included, all threads:", rows)
    print(flush=True)
