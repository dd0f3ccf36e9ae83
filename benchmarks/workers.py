"""Code that runs in worker processes (started with the ``spawn`` method).

Everything here is importable at module level and takes only picklable arguments, because
``spawn`` re-imports this module in a fresh interpreter.  Workers build their own redis-py
client and their own lock objects from an adapter key.

Timestamps are ``time.monotonic_ns()``, which on Linux reads CLOCK_MONOTONIC: one clock for
the whole machine, so a release stamped in one process and an acquire stamped in another
can be subtracted.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .adapters import get_adapter, make_client

# Worker processes can be many on 2 cores; how long the releaser sleeps between looks at the
# shared sequence number while it waits for another worker to take the lock (baton mode).
_BATON_POLL_S = 0.0005


@dataclass
class ChainConfig:
    """One run of workers looping acquire -> (critical section) -> release on one lock."""

    adapter: str
    url: str
    lock_name: str
    threads: int = 1
    #: GET+SET of this counter key inside the lock (lost-update check); None = no Redis work
    counter_key: Optional[str] = None
    #: after a release, wait until another worker has taken the lock before trying again, so
    #: every acquisition is a hand-off to a waiter that was already blocked in acquire()
    baton: bool = False
    #: random time (ms) to hold the lock, so a polling waiter is caught at a random phase
    hold_ms: Tuple[float, float] = (0.0, 0.0)
    duration_s: float = 2.0
    #: stop once this many acquisitions were made in total (all workers together)
    max_ops: int = 1_000_000
    acquire_timeout: float = 10.0


@dataclass
class ThreadResult:
    wid: str
    #: (sequence number, acquired at ns, released at ns) per completed critical section
    ops: List[Tuple[int, int, int]] = field(default_factory=list)
    timeouts: int = 0
    errors: List[str] = field(default_factory=list)
    #: longest single blocking acquire of this worker (ns), a timed-out one included:
    #: starvation shows here before it moves a mean or a fairness index
    max_wait_ns: int = 0


def chain_process(cfg: ChainConfig, proc_index: int, seq: Any, stop: Any, barrier: Any,
                  out_q: Any) -> None:
    """Body of one worker process: ``cfg.threads`` threads contend for ``cfg.lock_name``."""
    results: List[ThreadResult] = []
    try:
        adapter = get_adapter(cfg.adapter)
        client = make_client(cfg.url)
        client.ping()
        shared = adapter.make(client, cfg.lock_name) if adapter.share_across_threads else None
        # Lock objects are built before the start line so construction is not timed.
        locks = [shared if shared is not None else adapter.make(client, cfg.lock_name)
                 for _ in range(cfg.threads)]
        results = [ThreadResult(wid=f"p{proc_index}t{i}") for i in range(cfg.threads)]
    except Exception:
        out_q.put({"proc": proc_index, "fatal": traceback.format_exc(), "threads": []})
        barrier.abort()
        return
    barrier.wait(timeout=120)
    t_end = time.monotonic() + cfg.duration_s
    cpu0 = time.process_time()

    def loop(lock: Any, res: ThreadResult) -> None:
        rnd = random.Random(os.getpid() * 1000 + len(res.wid))
        try:
            while not stop.value:
                remaining = t_end - time.monotonic()
                if remaining <= 0:
                    stop.value = 1
                    break
                t_ask = time.monotonic_ns()
                ok = lock.acquire(timeout=min(cfg.acquire_timeout, remaining + 1.0))
                t_acq = time.monotonic_ns()
                if t_acq - t_ask > res.max_wait_ns:
                    res.max_wait_ns = t_acq - t_ask
                if not ok:
                    res.timeouts += 1
                    continue
                if stop.value:
                    lock.release()
                    break
                with seq.get_lock():
                    seq.value += 1
                    s = seq.value
                if cfg.counter_key is not None:
                    v = client.get(cfg.counter_key)
                    client.set(cfg.counter_key, int(v or 0) + 1)
                if cfg.hold_ms[1] > 0:
                    time.sleep(rnd.uniform(*cfg.hold_ms) / 1000.0)
                t_rel = time.monotonic_ns()
                lock.release()
                res.ops.append((s, t_acq, t_rel))
                if s >= cfg.max_ops:
                    stop.value = 1
                if cfg.baton:
                    while seq.value == s and not stop.value and time.monotonic() < t_end:
                        time.sleep(_BATON_POLL_S)
        except Exception:
            res.errors.append(traceback.format_exc(limit=3))

    threads = [threading.Thread(target=loop, args=(lk, r), daemon=True)
               for lk, r in zip(locks, results)]
    for t in threads:
        t.start()
    for t in threads:
        # bounded: the loop ends at t_end; a waiter still blocked gets acquire_timeout more
        t.join(cfg.duration_s + cfg.acquire_timeout + 5)
    cpu = time.process_time() - cpu0
    out_q.put({
        "proc": proc_index,
        "cpu_s": cpu,
        "stuck_threads": sum(t.is_alive() for t in threads),
        "threads": [r.__dict__ for r in results],
    })


def waiters_process(adapter_key: str, url: str, lock_name: str, n_threads: int,
                    ready: Any, go: Any, blocked: Any, out_q: Any,
                    acquire_timeout: float) -> None:
    """Open one client, report ready, then park ``n_threads`` threads in acquire() on a lock
    the parent holds (used to count the connections a process opens for its waiters)."""
    try:
        adapter = get_adapter(adapter_key)
        client = make_client(url)
        client.ping()
        shared = adapter.make(client, lock_name) if adapter.share_across_threads else None
        locks = [shared if shared is not None else adapter.make(client, lock_name)
                 for _ in range(n_threads)]
    except Exception:
        out_q.put({"fatal": traceback.format_exc()})
        ready.set()
        return
    ready.set()
    if not go.wait(60):
        out_q.put({"fatal": "parent never said go"})
        return
    got = [0]
    errors: List[str] = []
    mu = threading.Lock()

    def wait_once(lock: Any) -> None:
        try:
            if lock.acquire(timeout=acquire_timeout):
                with mu:
                    got[0] += 1
                lock.release()
        except Exception:
            with mu:
                errors.append(traceback.format_exc(limit=2))

    threads = [threading.Thread(target=wait_once, args=(lk,), daemon=True) for lk in locks]
    for t in threads:
        t.start()
    blocked.set()
    for t in threads:
        t.join(acquire_timeout + 10)
    out_q.put({"acquired": got[0], "errors": errors[:3],
               "stuck_threads": sum(t.is_alive() for t in threads)})


def keys_per_lock(keys: List[str], prefix: str) -> Dict[int, int]:
    """How many of ``keys`` belong to each lock ``<prefix>:<i>`` (by ``i``): a key belongs
    to the lock whose name it contains (``rlocks:rlock:{<prefix>:7}:q`` to lock 7)."""
    import re

    pattern = re.compile(re.escape(prefix) + r":(\d+)(?!\d)")
    out: Dict[int, int] = {}
    for k in keys:
        m = pattern.search(k)
        if m:
            i = int(m.group(1))
            out[i] = out.get(i, 0) + 1
    return out


def _scan(client: Any, prefix: str) -> List[str]:
    """Every key whose name contains ``<prefix>:`` (a bounded SCAN)."""
    found: List[str] = []
    for raw in client.scan_iter(match=f"*{prefix}:*", count=1000):
        found.append(raw.decode() if isinstance(raw, bytes) else raw)
        if len(found) > 1_000_000:
            break
    return found


def _single(locks: List[Any]) -> List[int]:
    """Acquire each lock (timed) and release it at once (untimed): one held at a time."""
    out: List[int] = []
    for lk in locks:
        t0 = time.monotonic_ns()
        ok = lk.acquire(timeout=5.0)
        out.append(time.monotonic_ns() - t0)
        if not ok:
            raise RuntimeError("a free, uncontended lock could not be acquired")
        lk.release()
    return out


def many_locks_process(adapter_key: str, url: str, prefix: str, count: int, single: int,
                       ttl: Optional[float], window_s: float, prewarm: bool,
                       keys_after_s: float, out_q: Any) -> None:
    """Hold ``count`` distinct locks ``<prefix>:<i>`` at once in this (fresh) process and
    measure: per-acquire and per-release time, ``used_memory`` growth and keys per lock
    while all are held, the Redis commands and CPU spent while everything is held and
    nothing else runs (i.e. renewal), and the keys left ``keys_after_s`` after the last
    release.  Beside it, ``single`` other locks ``<prefix>-one:<i>`` are acquired one at a
    time (each released at once) before the ``count`` are taken, while they are all held
    and after they were released: acquire with N held against acquire of one lock.

    ``prewarm``: take and release every name once first, so the state a library keeps
    for good once a name was used (rlocks' fencing counter of each cluster slot) exists
    before the memory is read: the growth is then that of the held locks alone."""
    from .redisinfo import breakdown_delta, command_breakdown, server_cpu_s, used_memory

    try:
        adapter = get_adapter(adapter_key)
        client = make_client(url)
        probe = make_client(url)  # INFO and SCAN on a separate connection
        client.ping()
        locks = [adapter.make_for_many(client, f"{prefix}:{i}", ttl) for i in range(count)]
        ones = [adapter.make_for_many(client, f"{prefix}-one:{i}", ttl) for i in range(single)]
        if prewarm:
            _single(locks + ones)
        half = single // 2
        one_before = _single(ones[:half])
        mem0 = used_memory(probe)
        acq: List[int] = []
        for lk in locks:
            t0 = time.monotonic_ns()
            ok = lk.acquire(timeout=5.0)
            acq.append(time.monotonic_ns() - t0)
            if not ok:
                raise RuntimeError("a fresh, uncontended lock could not be acquired")
        mem1 = used_memory(probe)
        held = keys_per_lock(_scan(probe, prefix), prefix)
        calls0 = command_breakdown(probe)
        scpu0 = server_cpu_s(probe)
        pcpu0 = time.process_time()
        w0 = time.monotonic()
        time.sleep(window_s)
        elapsed = time.monotonic() - w0
        pcpu = time.process_time() - pcpu0
        scpu = server_cpu_s(probe) - scpu0
        per_cmd = breakdown_delta(calls0, command_breakdown(probe))
        calls = sum(per_cmd.values())
        with_held = _single(ones)
        rel: List[int] = []
        for lk in locks:
            t0n = time.monotonic_ns()
            lk.release()
            rel.append(time.monotonic_ns() - t0n)
        t_rel = time.monotonic()
        time.sleep(max(0.0, t_rel + keys_after_s - time.monotonic()))
        left = keys_per_lock(_scan(probe, prefix), prefix)
        mem2 = used_memory(probe)
        one_after = _single(ones[half:])
        out_q.put({
            "count": count, "acquire_ns": acq, "release_ns": rel,
            "one_lock_acquire_ns": one_before + one_after,
            "with_held_acquire_ns": with_held,
            "mem_delta": mem1 - mem0, "mem_before": mem0, "mem_held": mem1,
            "mem_after": mem2, "window_s": elapsed,
            "keys_held": sum(held.values()), "keys_max_per_lock": max(held.values(), default=0),
            "locks_without_key": count - len(held),
            "keys_left": sum(left.values()), "names_left": len(left),
            "extra_cmds": calls, "extra_by_command": per_cmd,
            "client_cpu_s": pcpu, "server_cpu_s": scpu,
        })
    except Exception:
        out_q.put({"fatal": traceback.format_exc(limit=5)})


def drain(out_q: Any, n: int, timeout: float) -> List[Dict[str, Any]]:
    """Take up to ``n`` results from ``out_q`` within ``timeout`` seconds in total."""
    import queue

    got: List[Dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            got.append(out_q.get(timeout=left))
        except queue.Empty:
            break
    return got
