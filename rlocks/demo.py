"""``python -m rlocks demo``: several processes x threads share one RLock, then verify.

Every worker thread runs nested functions that each take the same ``rlocks.RLock`` around a
deliberately non-atomic read-modify-write (GET, then SET) of a Redis counter. Without a
correct cross-process lock, updates get lost; with it, the counter ends exactly at the
number of critical sections. The demo also measures handoff latency: the time from a
holder's release to the moment a waiting thread (usually in another process) returns from
``acquire``.

With no ``RLOCKS_URL`` it starts a throwaway ``redis-server`` (see :mod:`rlocks.server`) and
stops it afterwards. Prints go to the terminal only here and in the CLI.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from typing import List, Optional, Sequence

import redis

from .rlock import RLock
from .server import TemporaryRedisServer

__all__ = ["main"]


def _worker(url: str, run_id: str, threads: int, iterations: int) -> None:
    """One process: ``threads`` threads x ``iterations`` nested critical sections."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    lock = RLock(f"demo:{run_id}", client=client)
    counter, stamp, handoffs = (f"demo:{run_id}:{k}" for k in ("counter", "released", "handoffs"))

    def add_one() -> None:
        with lock:  # re-entry: the caller already holds it
            value = int(client.get(counter) or 0)
            client.set(counter, value + 1)

    def section() -> None:
        with lock:
            acquired = time.monotonic_ns()  # system-wide on Linux: comparable across processes
            previous = client.get(stamp)
            if previous is not None:
                client.rpush(handoffs, acquired - int(previous))
            add_one()
            client.set(stamp, time.monotonic_ns())
        # Release happened just now; whoever acquires next records the gap.

    def run() -> None:
        for _ in range(iterations):
            section()

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stderr.flush()


def _run(url: str, processes: int, threads: int, iterations: int) -> int:
    client = redis.Redis.from_url(url, socket_timeout=10)
    run_id = uuid.uuid4().hex[:8]
    total = processes * threads * iterations
    counter = f"demo:{run_id}:counter"
    print(f"rlocks demo: {processes} processes x {threads} threads x {iterations} nested "
          f"critical sections on one RLock ({url})")
    ctx = multiprocessing.get_context("spawn")
    workers = [
        ctx.Process(target=_worker, args=(url, run_id, threads, iterations))
        for _ in range(processes)
    ]
    started = time.monotonic()
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        _progress(int(client.get(counter) or 0), total)
        time.sleep(0.1)
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    _progress(int(client.get(counter) or 0), total)
    sys.stderr.write("\n")

    final = int(client.get(counter) or 0)
    gaps = sorted(int(x) / 1e6 for x in client.lrange(f"demo:{run_id}:handoffs", 0, -1))
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    client.delete(counter, f"demo:{run_id}:released", f"demo:{run_id}:handoffs")
    leftover = client.exists(f"rlocks:rlock:{{demo:{run_id}}}")

    def pct(p: float) -> str:
        if not gaps:
            return "n/a"
        return f"{gaps[min(len(gaps) - 1, int(p * len(gaps)))]:.2f} ms"

    rows = [
        ("critical sections run", f"{final}"),
        ("expected", f"{total}"),
        ("lost updates", f"{total - final}"),
        ("workers failed", f"{len(failed)}"),
        ("lock keys left in Redis", f"{leftover}"),
        ("throughput", f"{final / elapsed:.0f} sections/s"),
        ("handoff p50", pct(0.50)),
        ("handoff p99", pct(0.99)),
        ("handoff mean", f"{statistics.fmean(gaps):.2f} ms" if gaps else "n/a"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n  verification")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    ok = final == total and not failed and not leftover
    print(f"\n  {'OK: no lost updates' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlocks demo", description=__doc__)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=150)
    args = parser.parse_args(argv)
    if min(args.processes, args.threads, args.iterations) < 1:
        parser.error("--processes, --threads and --iterations must be at least 1")
    with ExitStack() as stack:
        url = os.environ.get("RLOCKS_URL")
        if not url:
            server = stack.enter_context(TemporaryRedisServer())
            url = server.url
            print(f"no RLOCKS_URL: started a throwaway redis-server on {url}")
        return _run(url, args.processes, args.threads, args.iterations)


def _entry(argv: List[str]) -> int:
    if not argv or argv[0] != "demo":
        sys.stderr.write("usage: python -m rlocks demo [--processes N] [--threads N] "
                         "[--iterations N]\n")
        return 2
    return main(argv[1:])
