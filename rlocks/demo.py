"""``python -m rlocks demo``: three use cases across processes x threads, then verify them.

Worker processes, each with several threads, go through three phases, one per use case:

1. **RLock, nested functions.** Each critical section calls a helper that takes the same
   lock again (re-entry) around a deliberately non-atomic read-modify-write (GET, then
   SET) of a Redis counter. Without a correct cross-process lock updates get lost; with
   it the counter ends exactly at the number of sections. This phase also measures
   handoff latency: from a holder's release to the moment a waiting thread (usually in
   another process) returns from ``acquire``.
2. **Semaphore, a pool of "connections".** A ``BoundedSemaphore`` of ``--pool-size``
   permits guards a pretend connection pool used by more threads than it has permits.
   An INCR/DECR gauge around each use measures how many are in use at once: the peak
   must be exactly the limit (never more; and the pool is really used to its limit).
3. **RWLock, readers and writers.** Writers update two keys one after the other under
   the write side; readers read both under the read side. A reader never sees the two
   differ (no half-done update), no write is lost, no reader or other writer is inside
   while a writer is, and several readers are inside at once.

Phases start together in every process (a start token per process in a Redis list), so
each phase is timed and shown on its own progress bar. With no URL given (``--url`` or
``RLOCKS_URL``) the demo starts a throwaway ``redis-server`` (see :mod:`rlocks.server`)
and stops it afterwards. Prints go to the terminal only here and in the CLI.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
import threading
import time
import traceback
import uuid
from contextlib import ExitStack
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import click
import redis

from ._engine.keys import keys_for
from .rlock import RLock
from .rwlock import RWLock
from .semaphore import BoundedSemaphore
from .server import RedisServerNotFound, TemporaryRedisServer

__all__ = ["Options", "ServerUnavailable", "run"]

PHASES = ("rlock", "pool", "rw")
_LABELS = {
    "rlock": "RLock      nested sections    ",
    "pool": "Semaphore  pool of connections",
    "rw": "RWLock     readers / writers  ",
}
# The demo's primitives: (key kind, role in _Keys.lock).
PRIMITIVES = (("rlock", "counter"), ("sem", "pool"), ("rw", "table"))
POOL_HOLD = 0.002  # s a thread keeps its "connection", so the pool fills up
READ_HOLD = 0.001  # s between a reader's two GETs, so readers overlap and tearing would show
WRITE_EVERY = 5  # one operation in this many is a write, in the RWLock phase
PHASE_TIMEOUT = 120.0  # s after which a phase that makes no progress counts as failed
START_TIMEOUT = 60  # s a worker waits for a phase's start token before giving up
WORKER_SOCKET_TIMEOUT = 30.0  # s a worker's client waits for any one reply
# A BLPOP is answered only when its wait ends: each one must end well within the socket
# timeout, or redis-py gives up on a server that is still blocking (TimeoutError).
START_SLICE = 5.0  # s one BLPOP for a start token blocks


class Options(NamedTuple):
    processes: int = 4
    threads: int = 2
    iterations: int = 150
    pool_size: int = 3


class ServerUnavailable(RuntimeError):
    """No URL was given and no throwaway redis-server could be started."""


class _Keys:
    """The demo's own data keys (plain keys outside the lock namespace) and lock names."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.prefix = f"rlocks-demo:{run_id}"
        self.lock_prefix = f"demo:{run_id}"

    def __call__(self, *parts: str) -> str:
        return ":".join((self.prefix,) + parts)

    def lock(self, role: str) -> str:
        return f"{self.lock_prefix}:{role}"


# -- worker processes ---------------------------------------------------------------------


def _worker(url: str, namespace: str, run_id: str, options: Options) -> None:
    """One process: for each phase, wait for its start token, then run its threads."""
    client = redis.Redis.from_url(url, socket_timeout=WORKER_SOCKET_TIMEOUT)
    keys = _Keys(run_id)
    bodies: Dict[str, Callable[[int], Dict[str, Any]]] = {
        "rlock": _rlock_phase(client, namespace, keys, options),
        "pool": _pool_phase(client, namespace, keys, options),
        "rw": _rw_phase(client, namespace, keys, options),
    }
    for phase in PHASES:
        if not _wait_start(client, keys("go", phase)):
            return  # the parent gave up (it reports the failure)
        threads = [
            threading.Thread(target=_run_thread, args=(client, keys, phase, bodies[phase], i))
            for i in range(options.threads)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _wait_start(client: "redis.Redis", key: str) -> bool:
    """Block up to START_TIMEOUT s for a start token on ``key``; False if none came.

    The wait is cut into BLPOPs of START_SLICE s: a single BLPOP longer than the client's
    socket timeout fails with TimeoutError when the other processes are slow to finish
    the previous phase (seen on a loaded machine)."""
    # Whole slices: a BLPOP timeout that rounds down to 0 ms would block for ever.
    for _ in range(max(1, round(START_TIMEOUT / START_SLICE))):
        if client.blpop([key], timeout=START_SLICE) is not None:
            return True
    return False


def _run_thread(
    client: "redis.Redis", keys: _Keys, phase: str, body: Callable[[int], Dict[str, Any]],
    index: int,
) -> None:
    try:
        summary = body(index)
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the demo
        client.rpush(keys("errors"), traceback.format_exc(limit=3))
        return
    client.rpush(keys("results", phase), json.dumps(summary))


def _rlock_phase(
    client: "redis.Redis", namespace: str, keys: _Keys, options: Options
) -> Callable[[int], Dict[str, Any]]:
    lock = RLock(keys.lock("counter"), client=client, namespace=namespace)
    counter, stamp, handoffs = keys("counter"), keys("released"), keys("handoffs")

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
        # Released just now; whoever acquires next records the gap.

    def body(_index: int) -> Dict[str, Any]:
        for _ in range(options.iterations):
            section()
        return {}

    return body


def _pool_phase(
    client: "redis.Redis", namespace: str, keys: _Keys, options: Options
) -> Callable[[int], Dict[str, Any]]:
    pool = BoundedSemaphore(keys.lock("pool"), options.pool_size, client=client,
                            namespace=namespace)
    gauge, done = keys("pool", "in-use"), keys("done", "pool")

    def use_connection() -> int:
        with pool:
            in_use = int(client.incr(gauge))  # atomic: the count including this thread
            time.sleep(POOL_HOLD)
            client.decr(gauge)
        client.incr(done)
        return in_use

    def body(_index: int) -> Dict[str, Any]:
        return {"peak": max(use_connection() for _ in range(options.iterations))}

    return body


def _rw_phase(
    client: "redis.Redis", namespace: str, keys: _Keys, options: Options
) -> Callable[[int], Dict[str, Any]]:
    rw = RWLock(keys.lock("table"), client=client, namespace=namespace)
    first, second = keys("rw", "first"), keys("rw", "second")
    readers, writers, done = keys("rw", "readers"), keys("rw", "writers"), keys("done", "rw")

    def read() -> Tuple[int, bool, bool]:
        with rw.read_lock:
            inside = int(client.incr(readers))
            writer_inside = int(client.get(writers) or 0) != 0
            a = client.get(first)
            time.sleep(READ_HOLD)
            b = client.get(second)
            client.decr(readers)
        return inside, a != b, writer_inside

    def write() -> bool:
        with rw.write_lock:
            alone = int(client.incr(writers)) == 1 and int(client.get(readers) or 0) == 0
            value = int(client.get(first) or 0) + 1  # non-atomic on purpose, like phase 1
            client.set(first, value)
            client.set(second, value)
            client.decr(writers)
        return alone

    def body(index: int) -> Dict[str, Any]:
        summary = {"reads": 0, "writes": 0, "torn": 0, "overlaps": 0, "peak_readers": 0}
        for i in range(options.iterations):
            if (i + index) % WRITE_EVERY == 0:
                summary["writes"] += 1
                summary["overlaps"] += 0 if write() else 1
            else:
                inside, torn, writer_inside = read()
                summary["reads"] += 1
                summary["torn"] += int(torn)
                summary["overlaps"] += int(writer_inside)
                summary["peak_readers"] = max(summary["peak_readers"], inside)
            client.incr(done)
        return summary

    return body


# -- the parent: phases, progress, verification --------------------------------------------


def _phase_done(client: "redis.Redis", keys: _Keys, phase: str) -> int:
    key = keys("counter") if phase == "rlock" else keys("done", phase)
    return int(client.get(key) or 0)


def _run_phase(
    client: "redis.Redis", keys: _Keys, phase: str, workers: Sequence[Any], total: int
) -> Tuple[bool, float]:
    """Start ``phase`` in every worker, show its progress; (finished, seconds)."""
    started = time.monotonic()
    client.rpush(keys("go", phase), *["go"] * len(workers))
    shown = 0
    last_progress = started
    with click.progressbar(length=total, label=_LABELS[phase], file=sys.stderr,
                           show_pos=True, show_eta=False) as bar:
        while True:
            done = _phase_done(client, keys, phase)
            if done > shown:
                bar.update(done - shown)
                shown, last_progress = done, time.monotonic()
            if done >= total:
                return True, time.monotonic() - started
            crashed = any(w.exitcode not in (None, 0) for w in workers)
            stalled = time.monotonic() - last_progress > PHASE_TIMEOUT
            if crashed or stalled or client.llen(keys("errors")):
                return False, time.monotonic() - started
            time.sleep(0.1)


def _results(client: "redis.Redis", keys: _Keys, phase: str) -> List[Dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(keys("results", phase), 0, -1)]


def _percentile(sorted_values: Sequence[float], p: float) -> Optional[float]:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def _lock_keys(namespace: str, kind: str, name: str) -> Tuple[str, str, str]:
    k = keys_for(namespace, kind, name)
    return (k.hash, k.queue, k.leases)


def _verify(
    client: "redis.Redis", namespace: str, keys: _Keys, options: Options,
    finished: Dict[str, bool], seconds: Dict[str, float],
) -> Dict[str, Any]:
    per_phase = options.processes * options.threads * options.iterations
    sections = int(client.get(keys("counter")) or 0)
    pool = _results(client, keys, "pool")
    rw = _results(client, keys, "rw")
    peak_pool = max((r["peak"] for r in pool), default=0)
    reads = sum(r["reads"] for r in rw)
    writes = sum(r["writes"] for r in rw)
    final_value = int(client.get(keys("rw", "first")) or 0)
    gaps = sorted(int(x) / 1e6 for x in client.lrange(keys("handoffs"), 0, -1))
    errors = [e.decode("utf-8", "replace") if isinstance(e, bytes) else str(e)
              for e in client.lrange(keys("errors"), 0, -1)]
    # Every key of the demo's primitives: holds hash, holder leases, queue of waiters.
    left = [key for kind, role in PRIMITIVES
            for key in _lock_keys(namespace, kind, keys.lock(role)) if client.exists(key)]
    pool_done = _phase_done(client, keys, "pool")

    def check(name: str, value: str, ok: bool) -> Dict[str, Any]:
        return {"check": name, "value": value, "ok": bool(ok)}

    checks = [
        check("RLock: nested critical sections run", f"{sections} of {per_phase}",
              sections == per_phase),
        check("RLock: lost updates", str(per_phase - sections), sections == per_phase),
        check("Semaphore: sections through the pool", f"{pool_done} of {per_phase}",
              pool_done == per_phase),
        check("Semaphore: peak pool use", f"{peak_pool} (limit {options.pool_size})",
              peak_pool == options.pool_size),
        check("RWLock: reads / writes", f"{reads} / {writes}",
              reads + writes == per_phase and finished["rw"]),
        check("RWLock: lost writes", str(writes - final_value), final_value == writes),
        check("RWLock: half-done updates seen", str(sum(r["torn"] for r in rw)),
              all(r["torn"] == 0 for r in rw)),
        check("RWLock: writer overlapped others", str(sum(r["overlaps"] for r in rw)),
              all(r["overlaps"] == 0 for r in rw)),
        check("RWLock: peak concurrent readers", str(max((r["peak_readers"] for r in rw),
                                                          default=0)),
              max((r["peak_readers"] for r in rw), default=0) > 1),
        check("worker errors", str(len(errors)), not errors),
        check("lock keys left in Redis", str(len(left)), not left),
    ]
    p50, p99 = _percentile(gaps, 0.50), _percentile(gaps, 0.99)
    return {
        "ok": all(c["ok"] for c in checks) and all(finished.values()),
        "checks": checks,
        "handoff_ms": {"p50": p50, "p99": p99,
                       "mean": statistics.fmean(gaps) if gaps else None, "samples": len(gaps)},
        "seconds": seconds,
        "errors": errors,
    }


def _print_table(report: Dict[str, Any]) -> None:
    def ms(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    rows = [(c["check"], c["value"], "ok" if c["ok"] else "FAILED") for c in report["checks"]]
    handoff = report["handoff_ms"]
    rows.append(("RLock: handoff latency p50 / p99",
                 f"{ms(handoff['p50'])} / {ms(handoff['p99'])} ms", ""))
    rows.append(("time per phase", " / ".join(
        f"{report['seconds'].get(p, 0):.1f}s" for p in PHASES), ""))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    click.echo("\n  verification")
    for name, value, verdict in rows:
        click.echo(f"  {name:<{widths[0]}}  {value:<{widths[1]}}  {verdict}".rstrip())
    for error in report["errors"][:1]:
        click.echo(f"\n  first worker error:\n{error}", err=True)
    click.echo("\n  " + ("OK: every check holds" if report["ok"] else "FAILED"))


def run(url: Optional[str], namespace: str = "rlocks", options: Optional[Options] = None,
        *, as_json: bool = False) -> bool:
    """Run the demo against ``url`` (``None``: a throwaway server); True when all checks hold.

    Prints progress on stderr and the verification table (or, ``as_json``, one JSON
    object) on stdout. Raises :class:`ServerUnavailable` when ``url`` is None and no
    redis-server can be started; Redis errors propagate.
    """
    options = options or Options()
    def info(text: str) -> None:
        # With --json, stdout carries only the JSON document; progress goes to stderr.
        click.echo(text, err=as_json)

    with ExitStack() as stack:
        if url is None:
            try:
                server = stack.enter_context(TemporaryRedisServer())
            except (RedisServerNotFound, RuntimeError) as exc:
                raise ServerUnavailable(f"no --url or RLOCKS_URL, and {exc}") from None
            url = server.url
            info(f"no --url or RLOCKS_URL: started a throwaway redis-server on {url}")
        return _run(url, namespace, options, as_json, info)


def _run(url: str, namespace: str, options: Options, as_json: bool,
         info: Callable[[str], None]) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    client.ping()  # fail in one line before any process starts
    keys = _Keys(uuid.uuid4().hex[:8])
    info(f"rlocks demo: {options.processes} processes x {options.threads} threads x "
         f"{options.iterations} sections per use case; pool of {options.pool_size}")
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_worker, args=(url, namespace, keys.run_id, options))
               for _ in range(options.processes)]
    for worker in workers:
        worker.start()
    per_phase = options.processes * options.threads * options.iterations
    finished: Dict[str, bool] = {phase: False for phase in PHASES}
    seconds: Dict[str, float] = {}
    try:
        for phase in PHASES:
            finished[phase], seconds[phase] = _run_phase(client, keys, phase, workers, per_phase)
            if not finished[phase]:
                break
        for worker in workers:
            worker.join(30)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                worker.join(5)
    report = _verify(client, namespace, keys, options, finished, seconds)
    for key in client.scan_iter(match=keys("*")):
        client.delete(key)
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))
    else:
        _print_table(report)
    return bool(report["ok"])
