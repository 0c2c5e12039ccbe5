"""The cost of payload encryption at rest on the three-step workload.

Runs ``bench.scale.three_steps`` (three trivial activities in a row) N times under
a started in-process Worker, alternately without a payload codec and with
``selvedge_django.codecs.FernetCodec`` (rounds interleaved, so that drift of the
machine falls on both sides), and prints the throughput of each and their ratio:
the codec's cost is ``1 - with / without``. Every result is checked.

    python bench/bench_codec.py                   # both databases, 200 workflows, 3 rounds
    python bench/bench_codec.py --db sqlite --workflows 300 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import bench_database, each_database


def one_round(n: int, encrypted: bool, key: str, offset: int) -> float:
    """Start n workflows, run them with a started Worker; return workflows per second."""
    from django.conf import settings
    from django.test import override_settings

    import selvedge_django as sv
    from bench import workloads
    from selvedge_django.worker import Worker

    extra = {"PAYLOAD_CODEC": "selvedge_django.codecs.FernetCodec", "PAYLOAD_KEYS": [key]}
    selvedge = {**getattr(settings, "SELVEDGE", {}), **(extra if encrypted else {})}
    with override_settings(SELVEDGE=selvedge):
        started = time.perf_counter()
        ids = [(sv.start_workflow(workloads.three_steps, offset + x), offset + x) for x in range(n)]
        worker = Worker()
        worker.start()
        try:
            for instance_id, x in ids:
                result = sv.wait_workflow(instance_id, timeout=300)
                if result.output != workloads.three_steps_output(x):
                    raise RuntimeError(f"{instance_id}: {result.status} {result.error!r}")
        finally:
            worker.stop(timeout=30)
        return n / (time.perf_counter() - started)


def run_one(db: str, n: int, rounds: int) -> None:
    with bench_database(db) as info:
        from selvedge_django.codecs import FernetCodec
        from selvedge_django.models import HistoryEvent

        key = FernetCodec.generate_key()
        print(f"== {db}: {info['version']} ==")
        print(f"Workload: {n} x bench.scale.three_steps per round, {rounds} rounds each way")
        one_round(20, False, key, 10_000_000)  # warm up: imports, connections, plans
        plain: list[float] = []
        sealed: list[float] = []
        for r in range(rounds):
            plain.append(one_round(n, False, key, 2 * r * n))
            sealed.append(one_round(n, True, key, (2 * r + 1) * n))
        stored = HistoryEvent.objects.filter(data__startswith='{"$codec"').count()
        without, with_codec = statistics.median(plain), statistics.median(sealed)
        print(f"without a codec: {without:8.1f} workflows/s  (rounds: {_fmt(plain)})")
        print(f"FernetCodec:     {with_codec:8.1f} workflows/s  (rounds: {_fmt(sealed)})")
        print(
            f"ratio with/without: {with_codec / without:.3f}  "
            f"(cost {100 * (1 - with_codec / without):+.1f} %); "
            f"{stored} encrypted history values written"
        )
        print(flush=True)


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--workflows", type=int, default=200, metavar="N")
    parser.add_argument("--rounds", type=int, default=3, metavar="R")
    args = parser.parse_args(argv)
    if args.workflows < 1 or args.rounds < 1:
        parser.error("--workflows and --rounds must be at least 1")
    if args.db != "all":
        run_one(args.db, args.workflows, args.rounds)
        return 0
    return each_database(
        __file__, ["--workflows", str(args.workflows), "--rounds", str(args.rounds)]
    )


if __name__ == "__main__":
    sys.exit(main())
