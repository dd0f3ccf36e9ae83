"""Where a contended critical section's time goes: ``python -m benchmarks.probe_section``.

A probe, not a benchmark section: it judges no target. P processes x T threads take one
lock in turn and run the contended section's body (``GET`` then ``SET`` of a counter);
each worker stamps, with the system-wide monotonic clock (``time.perf_counter``), when its
acquire returned, its ``GET`` and ``SET`` were answered, and its release began. Sorted by
acquire time, consecutive sections give the hand-off: from one worker's release call to
the next holder's acquire returning (in another process, for a fair lock with several
processes). Every step is printed as p50 and mean per library, so a gap between two
libraries can be located: in the hand-off, or in the section's own round trips (which
wait behind whatever else the server and the shared cores are doing meanwhile).

Usage: ``python -m benchmarks.probe_section [--url URL] [-p 4] [-t 2] [-s 5]
[LIBRARY ...]`` with LIBRARY among ``rlocks``, ``rlocks-unfair`` (``fair=False``) and
``python-redis-lock`` (default: all three). Without ``--url`` it starts a throwaway
``redis-server`` as the benchmarks do.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import redis

#: One section's stamps: acquire returned, GET answered, SET answered, release began.
Stamps = Tuple[float, float, float, float]

LIBRARIES = ("rlocks", "rlocks-unfair", "python-redis-lock")
COUNTER = "rlb:probe:counter"


def _lock_factory(library: str, client: redis.Redis) -> Any:
    """A function that returns the lock a worker thread uses (python-redis-lock's
    ``Lock`` is one object per thread; an rlocks lock is shared by the threads)."""
    if library == "python-redis-lock":
        import redis_lock

        return lambda: redis_lock.Lock(client, "rlb:probe:prl")
    import rlocks

    shared = rlocks.RLock("rlb:probe", client=client, fair=library == "rlocks")
    return lambda: shared


def _worker(url: str, library: str, threads: int, start: float, stop: float, out: Any) -> None:
    client = redis.Redis.from_url(url)
    make = _lock_factory(library, client)
    stamps: List[Stamps] = []
    now = time.perf_counter

    def run() -> None:
        lock = make()
        while time.time() < start:
            time.sleep(0.001)
        while time.time() < stop:
            lock.acquire()
            acquired = now()
            value = int(client.get(COUNTER) or 0)
            got = now()
            client.set(COUNTER, value + 1)
            done = now()
            released = now()
            lock.release()
            stamps.append((acquired, got, done, released))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put(stamps)


def probe(url: str, library: str, processes: int, threads: int, seconds: float) -> Dict[str, Any]:
    """Run one library; returns sections per second and each step's p50 and mean (µs)."""
    redis.Redis.from_url(url).delete(COUNTER)
    start = time.time() + 1.5  # every process has imported and connected by then
    stop = start + seconds
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, library, threads, start, stop, out))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    sections = sorted((s for _ in procs for s in out.get()), key=lambda s: s[0])
    for proc in procs:
        proc.join()
    counted = int(redis.Redis.from_url(url).get(COUNTER) or 0)
    if counted != len(sections):
        raise SystemExit(f"{library}: lost updates ({counted} counted, {len(sections)} run)")
    steps: Dict[str, List[float]] = {
        "GET": [s[1] - s[0] for s in sections],
        "SET": [s[2] - s[1] for s in sections],
        "hand-off": [b[0] - a[3] for a, b in zip(sections, sections[1:])],
    }
    span = (sections[-1][0] - sections[0][0]) / max(len(sections) - 1, 1)
    result: Dict[str, Any] = {"library": library, "sections/s": 1.0 / span, "per section": span}
    for name, values in steps.items():
        values.sort()
        result[name] = (values[len(values) // 2], statistics.mean(values))
    return result


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probe_section")
    parser.add_argument("libraries", nargs="*", metavar="LIBRARY", default=list(LIBRARIES))
    parser.add_argument("--url", help="a loopback Redis (default: a throwaway server)")
    parser.add_argument("-p", "--processes", type=int, default=4)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-s", "--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.libraries) - set(LIBRARIES))
    if unknown:
        parser.error(f"unknown library {', '.join(unknown)} (choose from {', '.join(LIBRARIES)})")
    if args.processes < 1 or args.threads < 1 or args.seconds <= 0:
        parser.error("-p and -t must be at least 1, -s positive")
    if args.url is None:
        from rlocks.server import TemporaryRedisServer

        with TemporaryRedisServer() as server:
            _report(server.url, args)
    else:
        _report(args.url, args)


def _report(url: str, args: argparse.Namespace) -> None:
    print(f"{args.processes} processes x {args.threads} threads, {args.seconds:g} s each; "
          "p50 / mean in µs (hand-off: release called -> next acquire returned)")
    print(f"{'library':<18} {'sections/s':>10} {'per section':>11} {'GET':>11} {'SET':>11} "
          f"{'hand-off':>11}")
    for library in args.libraries:
        r = probe(url, library, args.processes, args.threads, args.seconds)
        cells = " ".join(f"{r[k][0] * 1e6:5.0f}/{r[k][1] * 1e6:<5.0f}" for k in
                         ("GET", "SET", "hand-off"))
        print(f"{library:<18} {r['sections/s']:>10,.0f} {r['per section'] * 1e6:>9.0f}µs {cells}")


if __name__ == "__main__":
    main()
