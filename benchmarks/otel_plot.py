"""What an operator sees: rlocks' OpenTelemetry metrics during the demo's contention, plotted.

``python -m benchmarks.otel_plot [--out docs/metrics-contention.png]`` starts a throwaway
redis-server (or uses ``--url``), then worker processes whose threads run the demo's first
use case: nested ``RLock`` sections around a non-atomic GET/SET of a counter. Threads join
one by one over the first part of the run, so contention grows, then all run together.

Each worker records with the OpenTelemetry SDK: a ``PeriodicExportingMetricReader`` exports
every second, with delta temporality, to a JSON-lines file of its own. The parent merges
the files per second and computes percentiles from the histogram buckets the way
Prometheus's ``histogram_quantile`` does (linear within a bucket), so the picture shows
what a Prometheus dashboard fed by rlocks' default buckets would show. Needs
``opentelemetry-sdk`` and ``matplotlib`` (the test and bench extras).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

INTERVAL_MS = 1000


def _worker(url: str, name: str, out: str, threads: int, ramp: float, seconds: float) -> None:
    """One process: an SDK reader exporting to ``out`` every second, and ``threads`` threads
    that enter the lock's nested sections until ``seconds`` have passed."""
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, UpDownCounter
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        MetricExporter,
        MetricExportResult,
        MetricsData,
        PeriodicExportingMetricReader,
    )

    import rlocks
    import rlocks.metrics

    class FileExporter(MetricExporter):
        """Appends the rlocks points of each export as one JSON line."""

        def __init__(self) -> None:
            super().__init__(
                preferred_temporality={
                    Counter: AggregationTemporality.DELTA,
                    Histogram: AggregationTemporality.DELTA,
                    UpDownCounter: AggregationTemporality.CUMULATIVE,
                }
            )
            self._file = open(out, "a", encoding="utf-8")

        def export(
            self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any
        ) -> MetricExportResult:
            rows: List[Dict[str, Any]] = []
            for resource in metrics_data.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        for p in metric.data.data_points:
                            row: Dict[str, Any] = {
                                "metric": metric.name,
                                "time": p.time_unix_nano / 1e9,
                                "attributes": dict(p.attributes),
                            }
                            if hasattr(p, "bucket_counts"):
                                row.update(
                                    count=p.count,
                                    bounds=list(p.explicit_bounds),
                                    buckets=list(p.bucket_counts),
                                )
                            else:
                                row["value"] = p.value
                            rows.append(row)
            self._file.write(json.dumps({"exported": time.time(), "points": rows}) + "\n")
            self._file.flush()
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
            self._file.close()

    reader = PeriodicExportingMetricReader(FileExporter(), export_interval_millis=INTERVAL_MS)
    provider = MeterProvider(metric_readers=[reader])
    rlocks.metrics.configure(meter_provider=provider)
    client = redis.Redis.from_url(url, socket_timeout=10)
    counter = f"otel-plot:{name}:counter"
    start = time.monotonic()
    errors: List[BaseException] = []

    def run(index: int) -> None:
        try:
            time.sleep(index * ramp)  # threads join one by one: contention grows
            lock = rlocks.RLock(name, client=client)
            while time.monotonic() - start < seconds:
                with lock:
                    with lock:  # the demo's nested section: a re-entry
                        value = int(client.get(counter) or 0)
                        client.set(counter, value + 1)
        except BaseException as exc:  # noqa: BLE001 - reported by the process's exit code
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    provider.shutdown()  # a last export of what the final second recorded
    if errors:
        raise errors[0]


def _quantile(q: float, bounds: Sequence[float], buckets: Sequence[int]) -> Optional[float]:
    """Prometheus's histogram_quantile: linear interpolation inside the bucket reached."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0.0
    for i, count in enumerate(buckets):
        if seen + count >= rank and count:
            lower = bounds[i - 1] if i > 0 else 0.0
            if i >= len(bounds):  # the +Inf bucket: Prometheus answers the last bound
                return bounds[-1]
            return lower + (bounds[i] - lower) * (rank - seen) / count
        seen += count
    return bounds[-1]


def _merge(files: Sequence[Path], t0: float) -> Dict[str, Any]:
    """Per second since ``t0``: summed acquire buckets (all acquires, and those that
    waited), hand-overs, acquires, waiters."""
    buckets: Dict[int, List[int]] = {}
    waited: Dict[int, List[int]] = {}
    bounds: List[float] = []
    handovers: Dict[int, float] = defaultdict(float)
    acquires: Dict[int, float] = defaultdict(float)
    waiting: Dict[Tuple[int, int], float] = {}  # (second, file) -> waiting in that process
    for index, path in enumerate(files):
        for line in path.read_text(encoding="utf-8").splitlines():
            for row in json.loads(line)["points"]:
                second = int(row["time"] - t0)
                if row["metric"] == "rlocks.acquire.duration":
                    bounds = row["bounds"]
                    tables = [buckets]
                    if row["attributes"].get("waited"):
                        tables.append(waited)
                    for table in tables:
                        into = table.setdefault(second, [0] * len(row["buckets"]))
                        for i, count in enumerate(row["buckets"]):
                            into[i] += count
                    acquires[second] += row["count"]
                elif row["metric"] == "rlocks.handovers":
                    handovers[second] += row["value"]
                elif row["metric"] == "rlocks.waiting":
                    waiting[(second, index)] = row["value"]
    seconds = sorted(buckets)
    per_second_waiting: Dict[int, float] = defaultdict(float)
    for (second, _), value in waiting.items():
        per_second_waiting[second] += value
    return {
        "seconds": seconds,
        "quantiles": {
            q: [_quantile(q, bounds, buckets[s]) for s in seconds] for q in (0.5, 0.99)
        },
        "waited": {
            q: [_quantile(q, bounds, waited.get(s, [])) for s in seconds] for q in (0.5, 0.99)
        },
        "acquires": [acquires[s] for s in seconds],
        "handovers": [handovers[s] for s in seconds],
        "waiting": [per_second_waiting.get(s, 0.0) for s in seconds],
    }


def _plot(data: Dict[str, Any], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    seconds = data["seconds"]
    for key, label, color in (("quantiles", "all acquires", "tab:blue"),
                              ("waited", "acquires that waited", "tab:orange")):
        for q, style in ((0.5, "-"), (0.99, ":")):
            values = [v * 1000 if v is not None else float("nan") for v in data[key][q]]
            top.plot(seconds, values, style, color=color, marker="o", markersize=3,
                     label=f"p{round(q * 100)}, {label}")
    top.set_yscale("log")
    top.set_ylabel("rlocks.acquire.duration (ms)")
    top.set_title(title)
    top.legend(loc="upper left")
    top.grid(True, which="both", alpha=0.3)
    bottom.plot(seconds, data["acquires"], label="acquires / s")
    bottom.plot(seconds, data["handovers"], label="rlocks.handovers / s")
    bottom.set_ylabel("per second")
    bottom.set_xlabel("seconds since start")
    right = bottom.twinx()
    right.step(seconds, data["waiting"], where="post", color="tab:red",
               label="rlocks.waiting (at each export)")
    right.set_ylabel("waiting threads (all processes)")
    lines = bottom.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/metrics-contention.png")
    parser.add_argument("--url", default=None, help="a loopback Redis (default: throwaway)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="threads per process")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ramp", type=float, default=3.0,
                        help="seconds between two threads of a process joining")
    args = parser.parse_args(argv)

    from rlocks.server import TemporaryRedisServer

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        url = args.url or stack.enter_context(TemporaryRedisServer()).url
        name = f"otel-plot-{os.getpid()}"
        files = [Path(tmp) / f"worker-{i}.jsonl" for i in range(args.processes)]
        ctx = multiprocessing.get_context("spawn")
        t0 = time.time()
        procs = [
            ctx.Process(
                target=_worker,
                args=(url, name, str(f), args.threads, args.ramp, args.seconds),
            )
            for f in files
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        failed = [p.exitcode for p in procs if p.exitcode != 0]
        if failed:
            raise SystemExit(f"worker processes failed: exit codes {failed}")
        data = _merge([f for f in files if f.exists()], t0)
    title = (
        f"RLock, {args.processes} processes x {args.threads} threads joining every "
        f"{args.ramp:g} s: acquire time per second"
    )
    _plot(data, Path(args.out), title)
    print(f"wrote {args.out}: {sum(data['acquires']):.0f} acquires over "
          f"{len(data['seconds'])} s")


if __name__ == "__main__":
    main()
